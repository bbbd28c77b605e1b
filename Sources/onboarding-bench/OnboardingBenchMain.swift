import ArgumentParser
import OnboardingBench

@main
extension BenchCommand {}
