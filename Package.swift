// swift-tools-version:6.1
import PackageDescription

// One set of Swift settings for every target: Swift 6 language mode (complete concurrency
// checking is part of it) and no way to silently opt out.
let swiftSettings: [SwiftSetting] = [
    .swiftLanguageMode(.v6),
]

let package = Package(
    name: "onboarding",
    platforms: [.macOS(.v15)],
    products: [
        // The messaging interface and the in-process bus: what people test their own code against.
        .library(name: "Messaging", targets: ["Messaging"]),
        .library(name: "ZeroMQMessaging", targets: ["ZeroMQMessaging"]),
        .library(name: "OnboardingAPI", targets: ["OnboardingAPI"]),
        .library(name: "OnboardingClient", targets: ["OnboardingClient"]),
        // The services as libraries, and their shared plumbing: to run them in your own process.
        .library(name: "ServiceRuntime", targets: ["ServiceRuntime"]),
        .library(name: "AuthService", targets: ["AuthService"]),
        .library(name: "ProfileService", targets: ["ProfileService"]),
        .library(name: "ImageUploadService", targets: ["ImageUploadService"]),
        .library(name: "OnboardingOrchestrator", targets: ["OnboardingOrchestrator"]),
        // What tests of your own code need: the whole system in one process, stand-in services.
        .library(name: "OnboardingTesting", targets: ["OnboardingTesting"]),
        .executable(name: "auth-service", targets: ["auth-service"]),
        .executable(name: "profile-service", targets: ["profile-service"]),
        .executable(name: "image-upload-service", targets: ["image-upload-service"]),
        .executable(name: "onboarding-orchestrator", targets: ["onboarding-orchestrator"]),
        .executable(name: "onboarding-tap", targets: ["onboarding-tap"]),
        .executable(name: "onboarding-client", targets: ["onboarding-client"]),
        .executable(name: "onboarding-keys", targets: ["onboarding-keys"]),
        .executable(name: "onboarding-chaos", targets: ["onboarding-chaos"]),
        .executable(name: "onboarding-bench", targets: ["onboarding-bench"]),
        .executable(name: "onboarding-bench-parts", targets: ["onboarding-bench-parts"]),
        .executable(name: "onboarding-fake-provider", targets: ["onboarding-fake-provider"]),
        .library(name: "OnboardingGateway", targets: ["OnboardingGateway"]),
        .executable(name: "onboarding-gateway", targets: ["onboarding-gateway"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-async-algorithms", from: "1.1.4"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        // jwt-kit 5.7 and later need swift-crypto 4; everything else here takes 3 or 4.
        .package(url: "https://github.com/apple/swift-crypto", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/x-sheep/swift-property-based", from: "2.0.1"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift", from: "0.2.0"),
        .package(url: "https://github.com/vapor/jwt-kit", from: "5.7.1"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/mattpolzin/OpenAPIKit", from: "6.4.0"),
        .package(url: "https://github.com/apple/swift-configuration", from: "1.4.0"),
        .package(url: "https://github.com/apple/swift-system", from: "1.8.1"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-distributed-tracing", from: "1.7.3"),
        // OTLP over HTTP only: the gRPC exporter would build gRPC too.
        .package(url: "https://github.com/swift-otel/swift-otel", from: "1.6.0", traits: ["OTLPHTTP"]),
    ],
    targets: [
        // MARK: Messaging

        // No pkgConfig: Debian's libzmq.pc lists `-isystem /usr/include/mit-krb5` in its Cflags,
        // which SwiftPM prohibits and warns about in every package that depends on this one.
        // zmq.h is in /usr/include and the module map links "zmq", which is all it takes.
        .systemLibrary(
            name: "CZeroMQ",
            providers: [.apt(["libzmq3-dev"])]
        ),
        .target(
            name: "Messaging",
            dependencies: [
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "ZeroMQMessaging",
            dependencies: [
                "CZeroMQ",
                "Messaging",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .testTarget(
            name: "MessagingTests",
            dependencies: [
                "Messaging", "ZeroMQMessaging", "CZeroMQ", "FuzzKit", "TestSupport",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),

        // MARK: Settings (each declared once: flags, environment, file, help, README table)

        .target(
            name: "OnboardingSettings",
            dependencies: [
                "Messaging",
                .product(name: "Configuration", package: "swift-configuration"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .testTarget(
            name: "OnboardingSettingsTests",
            dependencies: [
                "OnboardingSettings", "OnboardingAPI", "AuthIdentity", "AuthService", "ProfileService", "OnboardingGateway",
                "ServiceRuntime",
                "FuzzKit",
                .product(name: "Configuration", package: "swift-configuration"),
            ]
        ),

        // MARK: The product's wire types and rules

        .target(
            name: "OnboardingAPI",
            dependencies: ["Messaging", "OnboardingSettings", .product(name: "Tracing", package: "swift-distributed-tracing")]
        ),
        .testTarget(
            name: "OnboardingAPITests",
            dependencies: ["OnboardingAPI", "FuzzKit", "Messaging"]
        ),

        // MARK: The PostgreSQL store

        // What every service's PostgreSQL store shares: where the database is (a URL), versioned
        // migrations that two replicas may run at once, and the outbox with dense sequence
        // numbers in commit order. Only executables and their tests link it: a user's tests of
        // the in-process system never build postgres-nio.
        // libpq, for the pipelined transactions of PostgresSupport (PipelineConnection).
        .systemLibrary(
            name: "CLibpq",
            pkgConfig: "libpq",
            providers: [.apt(["libpq-dev"])]
        ),
        .target(
            name: "PostgresSupport",
            dependencies: [
                "CLibpq", "Messaging", "OnboardingAPI", "OnboardingSettings", "ServiceRuntime",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ]
        ),
        // auth's store on PostgreSQL (the executable links it; AuthService never sees postgres-nio).
        .target(
            name: "AuthPostgres",
            dependencies: [
                "AuthService", "PostgresSupport", "Messaging", "OnboardingAPI", "OnboardingSettings", "ServiceRuntime",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // profile's store in PostgreSQL (see AuthPostgres).
        .target(
            name: "ProfilePostgres",
            dependencies: [
                "ProfileService", "PostgresSupport", "Messaging", "OnboardingAPI", "OnboardingSettings", "ServiceRuntime",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The orchestrator's store in PostgreSQL (see AuthPostgres), with the lead among replicas.
        .target(
            name: "OrchestratorPostgres",
            dependencies: [
                "OnboardingOrchestrator", "PostgresSupport", "Messaging", "OnboardingAPI", "OnboardingSettings", "ServiceRuntime",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .testTarget(
            name: "PostgresTests",
            dependencies: [
                "PostgresSupport", "AuthPostgres", "AuthService", "ProfilePostgres", "ProfileService", "OrchestratorPostgres", "OnboardingOrchestrator", "Messaging", "OnboardingAPI", "OnboardingSettings",
                "ServiceRuntime", "TestSupport",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),

        // MARK: Shared service plumbing

        .target(
            name: "ServiceRuntime",
            dependencies: [
                "Messaging",
                "OnboardingAPI",
                "OnboardingSettings",
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "GRDB", package: "GRDB.swift"),
                // SQLite's C API, for the few statements on the hot path (see HotStatement.swift).
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ]
        ),

        // MARK: Hosting (what every service and gateway executable does at start: settings,
        // logging, the ZeroMQ bus, the service group, signals, exit-with-parent)

        .target(
            name: "ServiceHosting",
            dependencies: [
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "OTel", package: "swift-otel"),
                .product(name: "NIOCore", package: "swift-nio"),
                "ServiceRuntime",
                "Messaging",
                "OnboardingAPI",
                "ZeroMQMessaging",
                "OnboardingSettings",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),

        // MARK: Verifying who signs in (provider ID tokens against their key sets, Naver's profile API)

        .target(
            name: "AuthIdentity",
            dependencies: [
                "OnboardingSettings",
                "Messaging",
                "OnboardingAPI",
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // A stand-in for Google, Apple, Kakao and Naver on loopback: key sets, rotation, Naver's
        // profile API; mints tokens. For the tests and for trying production mode on a laptop.
        .target(
            name: "FakeIdentityProvider",
            dependencies: [
                "OnboardingAPI",
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "onboarding-fake-provider",
            dependencies: [
                "OnboardingAPI",
                "FakeIdentityProvider",
                "OnboardingSettings",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .testTarget(
            name: "AuthIdentityTests",
            dependencies: [
                "Messaging", "OnboardingAPI",
                "AuthIdentity", "AuthService", "FakeIdentityProvider", "ServiceRuntime",
                .product(name: "JWTKit", package: "jwt-kit"),
            ]
        ),

        // MARK: Services

        .target(
            name: "AuthService",
            dependencies: [
                "Messaging", "OnboardingAPI", "OnboardingSettings",
                "ServiceRuntime",
                "AuthIdentity",
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        .executableTarget(
            name: "auth-service",
            dependencies: ["AuthService", "AuthPostgres", "ServiceHosting", "OnboardingAPI", "OnboardingSettings"]
        ),

        .target(
            name: "ProfileService",
            dependencies: ["ServiceRuntime"]
        ),
        .executableTarget(
            name: "profile-service",
            dependencies: ["ProfileService", "ProfilePostgres", "ServiceHosting", "OnboardingAPI", "OnboardingSettings"]
        ),

        // libvips (Debian's libvips-dev) decodes, strips and re-encodes every image. CVips wraps
        // its variadic C calls in plain functions Swift can call. pkg-config `gobject-2.0`, not
        // `vips`: libvips's headers are in /usr/include and need only GLib's, and the Cflags that
        // `vips` pulls in (-pthread) are flags SwiftPM prohibits and warns about in every package
        // that depends on this one. CVips links vips, gobject-2.0 and glib-2.0.
        .systemLibrary(
            name: "CLibVips",
            pkgConfig: "gobject-2.0",
            providers: [.apt(["libvips-dev"])]
        ),
        .target(
            name: "CVips",
            dependencies: ["CLibVips"],
            // What pkg-config `vips` would have linked; only C includes CLibVips, so nothing
            // autolinks its module map.
            linkerSettings: [.linkedLibrary("vips"), .linkedLibrary("gobject-2.0"), .linkedLibrary("glib-2.0")]
        ),
        .target(
            name: "ImageUploadService",
            dependencies: ["ServiceRuntime", "CVips", "Messaging", "OnboardingAPI", "OnboardingSettings"]
        ),
        .executableTarget(
            name: "image-upload-service",
            dependencies: ["ImageUploadService", "ServiceHosting", "OnboardingAPI", "OnboardingSettings"]
        ),

        .target(
            name: "OnboardingOrchestrator",
            dependencies: [
                "ServiceRuntime", .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ]
        ),
        .executableTarget(
            name: "onboarding-orchestrator",
            dependencies: ["OnboardingOrchestrator", "OrchestratorPostgres", "ServiceHosting", "OnboardingAPI", "OnboardingSettings"]
        ),

        .testTarget(
            name: "ServiceTests",
            dependencies: [
                "AuthService", "ProfileService", "ImageUploadService", "OnboardingOrchestrator", "ImageFixtures",
                "ZeroMQMessaging", "TestSupport", "FuzzKit", "AuthPostgres", "ProfilePostgres", "OrchestratorPostgres", "PostgresSupport",
                .product(name: "PropertyBased", package: "swift-property-based"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
            ]
        ),

        // MARK: Clients

        .target(
            name: "OnboardingClient",
            dependencies: [
                "Messaging",
                "OnboardingAPI",
                .product(name: "AsyncAlgorithms", package: "swift-async-algorithms"),
            ]
        ),
        .target(
            name: "ClientCommands",
            dependencies: [
                "Messaging",
                "OnboardingAPI",
                "OnboardingClient",
                "OnboardingSettings",
                "ZeroMQMessaging",
                "ServiceHosting",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .executableTarget(name: "onboarding-tap", dependencies: ["ClientCommands"]),
        .executableTarget(name: "onboarding-client", dependencies: ["ClientCommands"]),
        .executableTarget(name: "onboarding-keys", dependencies: ["ClientCommands"]),

        // MARK: The test kit (the whole system in one call, stand-in services; Examples/StubTesting uses it)

        .target(
            name: "OnboardingTesting",
            dependencies: [
                "OnboardingClient", "AuthService", "ProfileService", "ImageUploadService", "OnboardingOrchestrator",
                "ServiceRuntime",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .testTarget(
            name: "OnboardingTestingTests",
            dependencies: ["OnboardingTesting", "ZeroMQMessaging"]
        ),

        // MARK: The chaos test (drives people through the compose deployment while killing services)

        .target(
            name: "ChaosTest",
            dependencies: [
                "ClientCommands",
                "Messaging",
                "OnboardingAPI",
                "OnboardingSettings",
                "PostgresSupport",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                "ZeroMQMessaging",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        .executableTarget(name: "onboarding-chaos", dependencies: ["ChaosTest"]),
        .testTarget(
            name: "ChaosTestTests",
            dependencies: ["ChaosTest"]
        ),

        // MARK: The benchmark (an open-loop load generator on its own threads, libzmq directly)

        .target(
            name: "OnboardingBench",
            dependencies: [
                "CZeroMQ",
                "Messaging",
                "ZeroMQMessaging",
                "OnboardingSettings",
                "ClientCommands",
                "OnboardingAPI",
                "ServiceRuntime",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
            ]
        ),
        .executableTarget(name: "onboarding-bench", dependencies: ["OnboardingBench"]),
        .executableTarget(name: "onboarding-bench-parts", dependencies: ["OnboardingBench"]),
        .testTarget(
            name: "OnboardingBenchTests",
            dependencies: ["OnboardingBench", "TestSupport"]
        ),

        // MARK: The HTTP gateway (the app's front door: HTTP and Server-Sent Events over the bus)

        .target(
            name: "OnboardingGateway",
            dependencies: [
                "Messaging", "OnboardingAPI", "OnboardingSettings",
                "OnboardingClient",
                "ServiceRuntime",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            resources: [.copy("Resources/openapi.json"), .copy("Resources/demo.html")]
        ),
        .executableTarget(
            name: "onboarding-gateway",
            dependencies: ["OnboardingGateway", "ServiceHosting", "OnboardingSettings"]
        ),
        .testTarget(
            name: "GatewayTests",
            dependencies: [
                "OnboardingGateway", "AuthService", "ProfileService", "ImageUploadService", "OnboardingOrchestrator",
                "ImageFixtures", "ZeroMQMessaging", "ServiceHosting", "TestSupport",
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "OpenAPIKit", package: "OpenAPIKit"),
            ]
        ),

        // MARK: The whole system

        .testTarget(
            name: "SystemTests",
            dependencies: [
                "Messaging", "OnboardingAPI", "ServiceRuntime",
                "OnboardingClient", "AuthService", "ProfileService", "ImageUploadService",
                "OnboardingOrchestrator", "ZeroMQMessaging", "FuzzKit", "ImageFixtures", "OnboardingTesting",
                "FakeIdentityProvider", "ServiceHosting", "TestSupport", "AuthPostgres", "ProfilePostgres", "OrchestratorPostgres",
                "PostgresSupport",
            ]
        ),

        // MARK: Test support

        // Seeded random numbers, a byte-exact JSON writer and a corpus of hostile values, shared by
        // the fuzz tests of several test targets. Foundation only.
        .target(name: "FuzzKit", path: "Tests/FuzzKit"),
        // What several test targets share: a logger that keeps its lines, a loopback listener, the
        // test PostgreSQL database (a fresh schema per test) and the stores a test runs on.
        .target(
            name: "TestSupport",
            dependencies: [
                "PostgresSupport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
            ],
            path: "Tests/TestSupport"),
        // Real images made with libvips (PNG, JPEG, WebP, HEIC, with EXIF when asked), hand-made
        // hostile files, and readers of the metadata a stored file carries.
        .target(name: "ImageFixtures", dependencies: ["CVips"], path: "Tests/ImageFixtures"),
    ]
)

for target in package.targets where target.type != .system {
    target.swiftSettings = (target.swiftSettings ?? []) + swiftSettings
}
