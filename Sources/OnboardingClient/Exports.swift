// `import OnboardingClient` is all an app (or its tests) needs: the message types, error codes,
// topics and defaults (`OnboardingAPI`), and the bus interface with its in-process stub
// (`Messaging`) come with it.
@_exported import Messaging
@_exported import OnboardingAPI
