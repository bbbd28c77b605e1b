import ArgumentParser
import ClientCommands

@main
extension ClientCommand {}
