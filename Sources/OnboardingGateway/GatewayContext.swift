import Hummingbird
import NIOCore

/// The request context of every gateway route: Hummingbird's core context and the peer's
/// address, from which ``ClientAddress`` finds the client's.
public struct GatewayContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    /// The address of the TCP peer: the client, or the reverse proxy in front of the gateway.
    public let peerAddress: SocketAddress?

    public init(source: ApplicationRequestContextSource) {
        self.coreContext = .init(source: source)
        self.peerAddress = source.channel.remoteAddress
    }

    /// Bodies are read by the routes themselves, each with its own bound (``RequestLimits``).
    public var maxUploadSize: Int { RequestLimits.smallBody }
}
