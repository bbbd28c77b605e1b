import ArgumentParser
import ClientCommands

@main
extension TapCommand {}
