// swift-tools-version:6.1
import PackageDescription

// An app's own code, tested against the onboarding back end: with a stand-in orchestrator on the
// in-process bus, and against the whole system in one process. It depends on the back end by
// path, as your package would.

// `package:` below names a dependency by its identity; a path dependency's identity is the last
// component of its path, lowercased: "onboarding" for `.package(path: "../onboarding")`. Here
// the path is this repository, whose folder is named by whoever cloned it, so it is read off.
let onboarding = Context.packageDirectory.split(separator: "/").dropLast(2).last.map { $0.lowercased() } ?? "onboarding"

let package = Package(
    name: "StubTesting",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(path: "../.."),
    ],
    targets: [
        .target(
            name: "HomeScreen",
            dependencies: [.product(name: "OnboardingClient", package: onboarding)]
        ),
        .testTarget(
            name: "HomeScreenTests",
            dependencies: ["HomeScreen", .product(name: "OnboardingTesting", package: onboarding)]
        ),
    ]
)
