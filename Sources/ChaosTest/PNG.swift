import Foundation

/// Tiny but valid PNG images, so every set-up with an image uploads real bytes of its own.
public enum PNG {
    /// A 1×1 RGB image of one colour: signature, IHDR, one IDAT (zlib, one stored block) and IEND,
    /// each chunk with its CRC.
    public static func pixel(red: UInt8, green: UInt8, blue: UInt8) -> Data {
        var png = Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A])
        // Width 1, height 1, bit depth 8, colour type 2 (RGB), deflate, adaptive filtering, no interlace.
        png.append(chunk("IHDR", [0, 0, 0, 1, 0, 0, 0, 1, 8, 2, 0, 0, 0]))
        let scanline: [UInt8] = [0, red, green, blue]  // filter type 0, then the pixel
        var zlib: [UInt8] = [0x78, 0x01]
        let length = UInt16(scanline.count)
        zlib += [0x01, UInt8(length & 0xFF), UInt8(length >> 8), UInt8(~length & 0xFF), UInt8(~length >> 8)]
        zlib += scanline
        zlib += bigEndian(adler32(scanline))
        png.append(chunk("IDAT", zlib))
        png.append(chunk("IEND", []))
        return png
    }

    /// A pixel whose colour follows from `index`, so images of different people differ.
    public static func pixel(index: Int) -> Data {
        let value = UInt32(truncatingIfNeeded: index &* 2_654_435_761)
        return pixel(red: UInt8(value & 0xFF), green: UInt8((value >> 8) & 0xFF), blue: UInt8((value >> 16) & 0xFF))
    }

    static func chunk(_ type: String, _ data: [UInt8]) -> Data {
        let typeBytes = Array(type.utf8)
        var chunk = Data(bigEndian(UInt32(data.count)))
        chunk.append(contentsOf: typeBytes)
        chunk.append(contentsOf: data)
        chunk.append(contentsOf: bigEndian(crc32(typeBytes + data)))
        return chunk
    }

    static func bigEndian(_ value: UInt32) -> [UInt8] {
        [UInt8(value >> 24), UInt8((value >> 16) & 0xFF), UInt8((value >> 8) & 0xFF), UInt8(value & 0xFF)]
    }

    static func crc32(_ bytes: [UInt8]) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in bytes {
            crc ^= UInt32(byte)
            for _ in 0..<8 {
                crc = (crc & 1) == 1 ? (crc >> 1) ^ 0xEDB8_8320 : crc >> 1
            }
        }
        return ~crc
    }

    static func adler32(_ bytes: [UInt8]) -> UInt32 {
        var a: UInt32 = 1
        var b: UInt32 = 0
        for byte in bytes {
            a = (a + UInt32(byte)) % 65_521
            b = (b + a) % 65_521
        }
        return (b << 16) | a
    }
}
