import Foundation
import Messaging

/// Reading configuration: a flag wins, then the environment, then the documented default.
public enum Settings {
    public static func environment(_ name: String) -> String? {
        guard let value = ProcessInfo.processInfo.environment[name], !value.isEmpty else { return nil }
        return value
    }

    public static func endpoint(_ flag: String?, env: String, default value: Endpoint) -> Endpoint {
        if let flag { return Endpoint(flag) }
        if let text = environment(env) { return Endpoint(text) }
        return value
    }

    public static func integer(_ flag: Int?, env: String, default value: Int) -> Int {
        if let flag { return flag }
        if let text = environment(env), let number = Int(text) { return number }
        return value
    }
}
