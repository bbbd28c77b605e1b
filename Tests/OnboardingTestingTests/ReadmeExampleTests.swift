import Foundation
import Testing

/// The README's "Testing your own code" shows the example package's files; they must be the
/// files `./compose/onboarding test` builds and runs.
@Suite("The README shows the example package as it is")
struct ReadmeExampleTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    @Test(
        "each file of Examples/StubTesting is in the README, whole",
        arguments: [
            "Package.swift", "Sources/HomeScreen/HomeScreen.swift", "Tests/HomeScreenTests/StubTests.swift",
            "Tests/HomeScreenTests/SystemTests.swift",
        ])
    func fileInReadme(path: String) throws {
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        let file = try String(
            contentsOf: Self.root.appendingPathComponent("Examples/StubTesting").appendingPathComponent(path), encoding: .utf8)
        #expect(readme.contains("```swift\n" + file + "```"), "README.md does not show Examples/StubTesting/\(path) as it is")
    }

    @Test("every file of the example package is one the README shows")
    func noFileLeftOut() throws {
        let folder = Self.root.appendingPathComponent("Examples/StubTesting")
        let files = FileManager.default.enumerator(atPath: folder.path)?.compactMap { $0 as? String } ?? []
        let swiftFiles = files.filter { $0.hasSuffix(".swift") && !$0.hasPrefix(".build") }.sorted()
        #expect(swiftFiles == [
            "Package.swift", "Sources/HomeScreen/HomeScreen.swift", "Tests/HomeScreenTests/StubTests.swift",
            "Tests/HomeScreenTests/SystemTests.swift",
        ])
    }
}
