import ArgumentParser
import ClientCommands

@main
extension KeysCommand {}
