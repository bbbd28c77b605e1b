// `import OnboardingTesting` brings the client library with it (and through it the message
// types, `MessageBus` and `InProcessBus`), so a test file needs no other import of ours.
@_exported import OnboardingClient
