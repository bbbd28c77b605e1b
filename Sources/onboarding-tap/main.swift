import ClientCommands

await TapCommand.main()
