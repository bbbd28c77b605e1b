import ArgumentParser
import OnboardingBench

@main
extension PartsCommand {}
