// swift-tools-version:6.1
import PackageDescription

// An app's code, tested against the back end, which it depends on by path. The identity that
// `package:` names is the path's last component, lowercased; this repository's folder is named by
// whoever cloned it, so it is read off.
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
