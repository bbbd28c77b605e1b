import Foundation
import HTTPTypes
import NIOCore

/// Which address a request comes from, for rate limits and logs.
///
/// The TCP peer, unless the peer is a trusted reverse proxy (``GatewayConfiguration/trustedProxies``):
/// then the proxy's `X-Forwarded-For` is read from its right end, skipping addresses that are
/// themselves trusted proxies, and the first other address is the client's. Addresses a client
/// put at the left end of the header itself are never believed. With no trusted proxies (the
/// default) forwarded headers are ignored.
public struct ClientAddress: Sendable {
    public let trustedProxies: Set<String>

    public init(trustedProxies: Set<String>) {
        self.trustedProxies = trustedProxies
    }

    public func resolve(peer: SocketAddress?, headers: HTTPFields) -> String {
        let peerText = peer.flatMap(Self.text) ?? "unknown"
        guard trustedProxies.contains(peerText) else { return peerText }
        let forwarded = headers[values: HTTPField.Name("X-Forwarded-For")!]
            .flatMap { $0.split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { !$0.isEmpty }
        for address in forwarded.reversed() where !trustedProxies.contains(address) {
            return address
        }
        return forwarded.first ?? peerText
    }

    static func text(_ address: SocketAddress) -> String? {
        switch address {
        case .v4, .v6: address.ipAddress
        case .unixDomainSocket: "unix"
        }
    }
}
