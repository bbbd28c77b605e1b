import ArgumentParser
import Foundation
import OnboardingSettings
import ServiceHosting
import ZeroMQMessaging

/// `onboarding-keys`: the bus's CURVE key pairs, made and listed.
public struct KeysCommand: AsyncParsableCommand {
    public static let configuration = CommandConfiguration(
        commandName: "onboarding-keys",
        abstract: "Make and list the bus's CURVE keys: one pair per service, tool, operator or app server.",
        discussion: """
            NAME.key_secret holds a pair and only its owner may read it (0600); NAME.key is the \
            public key, to copy to every host that talks to NAME. A server admits every public key \
            in its keys directory, named by the file (NAME+LABEL.key is NAME too: a replacement).
            """,
        subcommands: [Make.self, Show.self])

    public init() {}

    struct Directory: ParsableArguments {
        @Option(help: ArgumentHelp(Setting.keysDir.helpLine, valueName: "dir"))
        var keysDir: String?
        @Option(help: ArgumentHelp(Setting.dataDir.helpLine, valueName: "dir"))
        var dataDir: String?

        var path: String {
            BusSecurity.keysDirectory(Settings(flags: [Setting.keysDir: keysDir, .dataDir: dataDir].compactMapValues { $0 }))
        }
    }

    struct Make: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Make the key pairs that are missing (existing ones are kept), then list the public keys.",
            discussion: "Without names: one pair for each program (\(BusSecurity.standardNames.joined(separator: ", "))).")

        @OptionGroup var directory: Directory
        @Argument(help: "Names of the pairs to make, e.g. an operator's (alice) or an app server's.")
        var names: [String] = []

        func run() async throws {
            let path = directory.path
            let made: [BusSecurity.MadeKey]
            do {
                made = try BusSecurity.makeKeys(in: path, names: names.isEmpty ? BusSecurity.standardNames : names)
            } catch {
                throw ValidationError("cannot make keys in \(path): \(error)")
            }
            print("keys in \(path):")
            for key in made {
                print("  \(key.name.padding(toLength: 14, withPad: " ", startingAt: 0)) \(key.publicKey.z85)  \(key.made ? "made" : "kept")")
            }
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List every public key in the keys directory: name, key, fingerprint.")

        @OptionGroup var directory: Directory

        func run() async throws {
            let path = directory.path
            let names: [String]
            do {
                names = try FileManager.default.contentsOfDirectory(atPath: path).filter { $0.hasSuffix(".key") }.sorted()
            } catch {
                throw ValidationError("cannot list \(path): make the keys with `onboarding-keys make --keys-dir \(path)`.")
            }
            for name in names {
                let file = "\(path)/\(name)"
                do {
                    let key = try CurveKeyFile.readPublic(file)
                    print("\(String(name.dropLast(4)).padding(toLength: 22, withPad: " ", startingAt: 0)) \(key.z85)  \(key.fingerprint)")
                } catch {
                    print("\(name): \(error)")
                }
            }
        }
    }
}
