import Foundation
import OnboardingAPI

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The container structure of PNG, JPEG and WebP files: where an upload's image ends (so a file
/// cut short is refused before decoding), and what a stored file may carry besides pixels.
///
/// Pure and thread-safe. Reads chunk and segment headers only, and for JPEG scans the
/// entropy-coded data for the next marker (with `memchr`).
enum ImageContainer {
    /// Whether `bytes` hold the whole structure of a `kind` image: for PNG every chunk up to and
    /// including `IEND`, for JPEG every segment up to the end-of-image marker, for WebP every
    /// chunk the RIFF header declares. HEIC is left to its decoder (`true`). Bytes after the end
    /// (a polyglot's payload) do not matter: they are never stored.
    static func isComplete(_ bytes: Data, kind: ImageKind) -> Bool {
        bytes.withUnsafeBytes { raw in
            switch kind {
            case .png: pngEnd(raw) != nil
            case .jpeg: jpegEnd(raw) != nil
            case .webp: webpEnd(raw) != nil
            case .heic: true
            }
        }
    }

    /// `bytes` (a file this service encoded) with nothing but what its pixels need: for PNG the
    /// critical chunks and `tRNS`; for JPEG no APP1–APP13, APP15 or comment segments (the JFIF
    /// APP0 and Adobe APP14, which say how to decode the colours, stay); for WebP no `EXIF`, `XMP `
    /// or `ICCP` chunk, and their flags cleared. Nothing after the image's end is kept. `nil` when
    /// the structure cannot be read.
    ///
    /// This is a second layer under libvips's own stripping, which some versions skip (libvips
    /// 8.14's WebP writer always writes EXIF).
    static func strippingMetadata(_ bytes: Data, kind: ImageKind) -> Data? {
        bytes.withUnsafeBytes { raw in
            switch kind {
            case .png: strippedPNG(raw)
            case .jpeg: strippedJPEG(raw)
            case .webp: strippedWebP(raw)
            case .heic: nil
            }
        }
    }

    // MARK: PNG

    private static let pngSignature: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]
    private static let pngKept: Set<String> = ["IHDR", "PLTE", "tRNS", "IDAT", "IEND"]

    /// Each chunk of a PNG: its type and its whole range (length, type, data and CRC), up to
    /// `IEND`; `nil` when a chunk runs past the bytes or `IEND` never comes.
    private static func pngChunks(_ raw: UnsafeRawBufferPointer) -> [(type: String, range: Range<Int>)]? {
        guard raw.count >= 8, raw.prefix(8).elementsEqual(pngSignature) else { return nil }
        var chunks: [(String, Range<Int>)] = []
        var offset = 8
        while offset + 12 <= raw.count {
            let length = Int(bigEndian32(raw, offset))
            guard length <= raw.count - offset - 12 else { return nil }
            let type = String(decoding: raw[(offset + 4)..<(offset + 8)], as: UTF8.self)
            chunks.append((type, offset..<(offset + 12 + length)))
            offset += 12 + length
            if type == "IEND" { return chunks }
        }
        return nil
    }

    private static func pngEnd(_ raw: UnsafeRawBufferPointer) -> Int? { pngChunks(raw)?.last?.range.upperBound }

    private static func strippedPNG(_ raw: UnsafeRawBufferPointer) -> Data? {
        guard let chunks = pngChunks(raw) else { return nil }
        var out = Data(pngSignature)
        for chunk in chunks where pngKept.contains(chunk.type) { out.append(contentsOf: raw[chunk.range]) }
        return out
    }

    // MARK: JPEG

    /// The segments of a JPEG up to its end-of-image marker: each marker with the range of the
    /// whole segment (marker included); entropy-coded data belongs to the scan segment before it.
    /// `nil` when a segment runs past the bytes or the end-of-image marker never comes.
    private static func jpegSegments(_ raw: UnsafeRawBufferPointer) -> [(marker: UInt8, range: Range<Int>)]? {
        guard raw.count >= 4, raw[0] == 0xFF, raw[1] == 0xD8 else { return nil }
        var segments: [(UInt8, Range<Int>)] = [(0xD8, 0..<2)]
        var offset = 2
        while offset + 2 <= raw.count {
            guard raw[offset] == 0xFF else {
                // Stray bytes between segments: decoders skip them (libjpeg with a warning).
                offset += 1
                continue
            }
            let marker = raw[offset + 1]
            if marker == 0xFF {
                offset += 1  // fill byte
                continue
            }
            if marker == 0xD9 {
                segments.append((marker, offset..<(offset + 2)))
                return segments
            }
            if (0xD0...0xD7).contains(marker) || marker == 0x01 {
                segments.append((marker, offset..<(offset + 2)))
                offset += 2
                continue
            }
            guard offset + 4 <= raw.count else { return nil }
            let length = Int(raw[offset + 2]) << 8 | Int(raw[offset + 3])
            guard length >= 2, offset + 2 + length <= raw.count else { return nil }
            var end = offset + 2 + length
            if marker == 0xDA {
                // Entropy-coded data runs to the next marker that is neither a stuffed 0xFF00
                // nor a restart marker.
                guard let next = nextMarker(raw, from: end) else { return nil }
                end = next
            }
            segments.append((marker, offset..<end))
            offset = end
        }
        return nil
    }

    private static func nextMarker(_ raw: UnsafeRawBufferPointer, from start: Int) -> Int? {
        guard let base = raw.baseAddress else { return nil }
        var offset = start
        while offset + 1 < raw.count {
            guard let found = memchr(base + offset, 0xFF, raw.count - offset) else { return nil }
            let index = base.distance(to: UnsafeRawPointer(found))
            guard index + 1 < raw.count else { return nil }
            let next = raw[index + 1]
            if next != 0x00, !(0xD0...0xD7).contains(next) { return index }
            offset = index + 1
        }
        return nil
    }

    private static func jpegEnd(_ raw: UnsafeRawBufferPointer) -> Int? { jpegSegments(raw)?.last?.range.upperBound }

    private static func strippedJPEG(_ raw: UnsafeRawBufferPointer) -> Data? {
        guard let segments = jpegSegments(raw) else { return nil }
        var out = Data()
        for segment in segments {
            let marker = segment.marker
            let isMetadata = (0xE1...0xED).contains(marker) || marker == 0xEF || marker == 0xFE
            let isForeignAPP0 = marker == 0xE0 && !raw[segment.range].dropFirst(4).starts(with: Array("JFIF\0".utf8))
            if isMetadata || isForeignAPP0 { continue }
            out.append(contentsOf: raw[segment.range])
        }
        return out
    }

    // MARK: WebP

    private static let webpKept: Set<String> = ["VP8X", "VP8 ", "VP8L", "ALPH", "ANIM", "ANMF"]

    /// The chunks of a WebP inside its RIFF container; `nil` when the container is not whole.
    private static func webpChunks(_ raw: UnsafeRawBufferPointer) -> [(id: String, range: Range<Int>)]? {
        guard raw.count >= 12, String(decoding: raw[0..<4], as: UTF8.self) == "RIFF",
            String(decoding: raw[8..<12], as: UTF8.self) == "WEBP"
        else { return nil }
        let riffEnd = 8 + Int(littleEndian32(raw, 4))
        guard riffEnd <= raw.count, riffEnd > 12 else { return nil }
        var chunks: [(String, Range<Int>)] = []
        var offset = 12
        while offset < riffEnd {
            guard offset + 8 <= riffEnd else { return nil }
            let length = Int(littleEndian32(raw, offset + 4))
            let padded = length + (length & 1)
            guard padded <= riffEnd - offset - 8 else { return nil }
            chunks.append((String(decoding: raw[offset..<(offset + 4)], as: UTF8.self), offset..<(offset + 8 + padded)))
            offset += 8 + padded
        }
        return chunks.isEmpty ? nil : chunks
    }

    private static func webpEnd(_ raw: UnsafeRawBufferPointer) -> Int? { webpChunks(raw)?.last?.range.upperBound }

    private static func strippedWebP(_ raw: UnsafeRawBufferPointer) -> Data? {
        guard let chunks = webpChunks(raw) else { return nil }
        var body = Data("WEBP".utf8)
        for chunk in chunks where webpKept.contains(chunk.id) {
            var bytes = Data(raw[chunk.range])
            if chunk.id == "VP8X", bytes.count >= 9 {
                // Flags: ICC profile 0x20, EXIF 0x08, XMP 0x04.
                bytes[bytes.startIndex + 8] &= ~UInt8(0x20 | 0x08 | 0x04)
            }
            body.append(bytes)
        }
        var out = Data("RIFF".utf8)
        let size = UInt32(body.count)
        out.append(contentsOf: [UInt8(size & 0xFF), UInt8((size >> 8) & 0xFF), UInt8((size >> 16) & 0xFF), UInt8(size >> 24)])
        out.append(body)
        return out
    }

    // MARK: Numbers

    private static func bigEndian32(_ raw: UnsafeRawBufferPointer, _ offset: Int) -> UInt32 {
        raw[offset..<(offset + 4)].reduce(0) { $0 << 8 | UInt32($1) }
    }

    private static func littleEndian32(_ raw: UnsafeRawBufferPointer, _ offset: Int) -> UInt32 {
        raw[offset..<(offset + 4)].reversed().reduce(0) { $0 << 8 | UInt32($1) }
    }
}
