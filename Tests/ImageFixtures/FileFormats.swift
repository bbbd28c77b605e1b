import Foundation

/// Readers of the structure of stored files: which segments and chunks they carry, so tests can
/// say "no EXIF" by the bytes themselves, not by asking the library that wrote them.
public enum FileStructure {
    /// The markers of a JPEG's segments up to the image data (`0xE1` is APP1, where EXIF and XMP
    /// live; `0xFE` a comment), and how many bytes follow the end-of-image marker.
    public static func jpegMarkers(_ bytes: Data) -> (markers: [UInt8], segments: [(marker: UInt8, payload: Data)], trailing: Int)? {
        let b = [UInt8](bytes)
        guard b.count >= 4, b[0] == 0xFF, b[1] == 0xD8 else { return nil }
        var markers: [UInt8] = []
        var segments: [(UInt8, Data)] = []
        var i = 2
        while i + 4 <= b.count {
            guard b[i] == 0xFF else { return nil }
            let marker = b[i + 1]
            if marker == 0xFF { i += 1; continue }
            markers.append(marker)
            if marker == 0xD9 { return (markers, segments, b.count - (i + 2)) }
            if (0xD0...0xD7).contains(marker) || marker == 0x01 { i += 2; continue }
            let length = Int(b[i + 2]) << 8 | Int(b[i + 3])
            guard length >= 2, i + 2 + length <= b.count else { return nil }
            segments.append((marker, Data(b[(i + 4)..<(i + 2 + length)])))
            i += 2 + length
            if marker == 0xDA {
                // Entropy-coded data: skip to the next marker that is not a stuffed byte or a restart.
                while i + 1 < b.count {
                    if b[i] == 0xFF, b[i + 1] != 0x00, !(0xD0...0xD7).contains(b[i + 1]) { break }
                    i += 1
                }
            }
        }
        return (markers, segments, 0)
    }

    /// Whether a JPEG carries an APP1 `Exif` segment, and whether its first IFD points to GPS
    /// data (tag 0x8825).
    public static func jpegExif(_ bytes: Data) -> (hasExif: Bool, hasGPS: Bool) {
        guard let parsed = jpegMarkers(bytes) else { return (false, false) }
        for (marker, payload) in parsed.segments where marker == 0xE1 {
            let p = [UInt8](payload)
            guard p.count > 14, Array(p[0..<6]) == Array("Exif".utf8) + [0, 0] else { continue }
            return (true, tiffTags(Array(p[6...])).contains(0x8825))
        }
        return (false, false)
    }

    /// The tags of the first IFD of a TIFF structure (as inside an EXIF block).
    public static func tiffTags(_ tiff: [UInt8]) -> [UInt16] {
        guard tiff.count >= 8 else { return [] }
        let little = tiff[0] == 0x49
        func u16(_ at: Int) -> Int { little ? Int(tiff[at]) | Int(tiff[at + 1]) << 8 : Int(tiff[at]) << 8 | Int(tiff[at + 1]) }
        func u32(_ at: Int) -> Int { little ? u16(at) | u16(at + 2) << 16 : u16(at) << 16 | u16(at + 2) }
        let ifd = u32(4)
        guard ifd + 2 <= tiff.count else { return [] }
        let count = u16(ifd)
        return (0..<count).compactMap { index in
            let entry = ifd + 2 + index * 12
            return entry + 12 <= tiff.count ? UInt16(u16(entry)) : nil
        }
    }

    /// The chunk types of a PNG in order, and how many bytes follow `IEND`.
    public static func pngChunks(_ bytes: Data) -> (types: [String], trailing: Int)? {
        let b = [UInt8](bytes)
        guard b.count >= 8, Array(b[0..<8]) == [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A] else { return nil }
        var types: [String] = []
        var i = 8
        while i + 12 <= b.count {
            let length = Int(b[i]) << 24 | Int(b[i + 1]) << 16 | Int(b[i + 2]) << 8 | Int(b[i + 3])
            let type = String(decoding: b[(i + 4)..<(i + 8)], as: UTF8.self)
            types.append(type)
            i += 12 + length
            if type == "IEND" { return (types, max(0, b.count - i)) }
        }
        return (types, 0)
    }

    /// The chunk ids inside a WebP's RIFF container, and how many bytes follow the RIFF size.
    public static func webpChunks(_ bytes: Data) -> (ids: [String], trailing: Int)? {
        let b = [UInt8](bytes)
        guard b.count >= 12, String(decoding: b[0..<4], as: UTF8.self) == "RIFF",
            String(decoding: b[8..<12], as: UTF8.self) == "WEBP"
        else { return nil }
        let riffEnd = 8 + (Int(b[4]) | Int(b[5]) << 8 | Int(b[6]) << 16 | Int(b[7]) << 24)
        var ids: [String] = []
        var i = 12
        while i + 8 <= min(b.count, riffEnd) {
            ids.append(String(decoding: b[i..<(i + 4)], as: UTF8.self))
            let length = Int(b[i + 4]) | Int(b[i + 5]) << 8 | Int(b[i + 6]) << 16 | Int(b[i + 7]) << 24
            i += 8 + length + (length & 1)
        }
        return (ids, max(0, b.count - riffEnd))
    }
}

/// Files a careful attacker sends, made by hand.
public enum HostileFile {
    /// A PNG that is a signature and an `IHDR` (with a correct CRC) declaring `width` × `height`
    /// RGB pixels, a one-byte `IDAT` and `IEND`: its header reads fine, its pixels are not there.
    public static func pngHeader(width: UInt32, height: UInt32) -> Data {
        var png = Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A])
        png.append(chunk("IHDR", bigEndian(width) + bigEndian(height) + [8, 2, 0, 0, 0]))
        png.append(chunk("IDAT", [0x78, 0x01, 0x01]))
        png.append(chunk("IEND", []))
        return png
    }

    /// A GIF of one pixel (a format libvips reads, but which is not allowed).
    public static let gif = Data(
        [0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, 0xFF, 0xFF, 0xFF, 0x00, 0x00, 0x00,
         0x21, 0xF9, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x2C, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00,
         0x02, 0x02, 0x44, 0x01, 0x00, 0x3B])

    /// An SVG document (libvips reads SVG through librsvg, which is not allowed).
    public static let svg = Data(#"<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>"#.utf8)

    /// A script a polyglot carries after the image's last byte.
    public static let script = Data("<script>alert(document.cookie)</script>\n#!/bin/sh\nrm -rf ~\n".utf8)

    static func chunk(_ type: String, _ data: [UInt8]) -> Data {
        let body = Array(type.utf8) + data
        return Data(bigEndian(UInt32(data.count)) + body + bigEndian(crc32(body)))
    }

    static func bigEndian(_ value: UInt32) -> [UInt8] {
        [UInt8(value >> 24), UInt8((value >> 16) & 0xFF), UInt8((value >> 8) & 0xFF), UInt8(value & 0xFF)]
    }

    public static func crc32(_ bytes: [UInt8]) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in bytes {
            crc ^= UInt32(byte)
            for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0xEDB8_8320 : crc >> 1 }
        }
        return ~crc
    }
}

/// An EXIF block, as a camera writes it: a TIFF structure (little-endian) whose first IFD names
/// the camera and points to a GPS IFD with a latitude and longitude.
public enum EXIF {
    /// `Exif\0\0` and the TIFF structure, with the position given in degrees (north and east
    /// positive).
    public static func withGPS(latitude: Double, longitude: Double, make: String = "ProbeCam") -> [UInt8] {
        var tiff: [UInt8] = [0x49, 0x49, 0x2A, 0x00, 0x08, 0x00, 0x00, 0x00]
        func u16(_ v: Int) -> [UInt8] { [UInt8(v & 0xFF), UInt8((v >> 8) & 0xFF)] }
        func u32(_ v: Int) -> [UInt8] { u16(v & 0xFFFF) + u16((v >> 16) & 0xFFFF) }
        func entry(_ tag: Int, _ type: Int, _ count: Int, _ value: [UInt8]) -> [UInt8] {
            u16(tag) + u16(type) + u32(count) + value + [UInt8](repeating: 0, count: 4 - value.count)
        }
        let makeBytes = Array(make.utf8) + [0]
        // IFD0: Make (ASCII, stored after the IFD) and the GPS IFD pointer.
        let ifd0Entries = 2
        let ifd0Size = 2 + ifd0Entries * 12 + 4
        let makeOffset = 8 + ifd0Size
        let gpsOffset = makeOffset + makeBytes.count + (makeBytes.count & 1)
        tiff += u16(ifd0Entries)
        tiff += entry(0x010F, 2, makeBytes.count, u32(makeOffset))
        tiff += entry(0x8825, 4, 1, u32(gpsOffset))
        tiff += u32(0)
        tiff += makeBytes + (makeBytes.count & 1 == 1 ? [0] : [])
        // GPS IFD: version, latitude ref and value, longitude ref and value.
        let gpsEntries = 5
        let gpsSize = 2 + gpsEntries * 12 + 4
        let latitudeOffset = gpsOffset + gpsSize
        let longitudeOffset = latitudeOffset + 24
        func rationals(_ degrees: Double) -> [UInt8] {
            let value = abs(degrees)
            let whole = Int(value)
            let minutes = Int((value - Double(whole)) * 60)
            let seconds = Int(((value - Double(whole)) * 60 - Double(minutes)) * 60 * 100)
            return u32(whole) + u32(1) + u32(minutes) + u32(1) + u32(seconds) + u32(100)
        }
        tiff += u16(gpsEntries)
        tiff += entry(0x0000, 1, 4, [2, 3, 0, 0])
        tiff += entry(0x0001, 2, 2, Array((latitude >= 0 ? "N" : "S").utf8) + [0])
        tiff += entry(0x0002, 5, 3, u32(latitudeOffset))
        tiff += entry(0x0003, 2, 2, Array((longitude >= 0 ? "E" : "W").utf8) + [0])
        tiff += entry(0x0004, 5, 3, u32(longitudeOffset))
        tiff += u32(0)
        tiff += rationals(latitude) + rationals(longitude)
        return Array("Exif".utf8) + [0, 0] + tiff
    }
}
