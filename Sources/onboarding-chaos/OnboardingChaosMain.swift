import ArgumentParser
import ChaosTest

@main
extension ChaosCommand {}
