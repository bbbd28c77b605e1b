import ClientCommands

await ClientCommand.main()
