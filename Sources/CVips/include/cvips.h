#ifndef CVIPS_H
#define CVIPS_H

// Non-variadic wrappers over the few libvips calls the image-upload service makes, so that Swift
// (which cannot call C variadic functions) never sees libvips or GLib itself: images are an
// opaque type, bytes are plain buffers, and every failure is NULL or -1 with the reason in
// libvips's error buffer (cvips_take_error).
//
// Threading: libvips is thread-safe. One image (and everything made from it) is used by one
// thread at a time; the service runs each upload's whole pipeline on one of its decode threads.
// Every function that returns a cvips_image returns a new reference that the caller releases
// with cvips_release, whatever it was made from.

#include <stddef.h>

typedef struct cvips_image cvips_image;

/// The formats the service writes (and, for CVIPS_HEIC, only the tests).
typedef enum {
    CVIPS_PNG = 0,
    CVIPS_JPEG = 1,
    CVIPS_WEBP = 2,
    CVIPS_HEIC = 3,
} cvips_format;

/// Starts libvips once per process (later calls return the first call's result): one worker
/// thread per libvips pipeline, no operation cache, every loader blocked except the buffer loaders
/// of PNG, JPEG, WebP and HEIF (libvips's untrusted loaders included), and libvips's warnings
/// (which it prints to stderr) silenced. Returns 0 on success.
int cvips_start(const char *program);

/// Copies libvips's error text (at most size - 1 bytes, NUL-terminated) into buffer and clears
/// it. The buffer is process-wide: under concurrent failures the text may mix two of them.
void cvips_take_error(char *buffer, size_t size);

/// The peak of memory libvips has allocated for pixels since the process started, in bytes.
size_t cvips_tracked_memory_peak(void);

/// Opens an image from bytes and reads its header only (sequential access; pixels are decoded
/// later, by cvips_decode). Truncated or damaged pixel data makes cvips_decode fail. The bytes
/// must stay valid and unchanged until the image and everything made from it are released.
cvips_image *cvips_open(const void *bytes, size_t length);

int cvips_width(const cvips_image *image);
int cvips_height(const cvips_image *image);
int cvips_bands(const cvips_image *image);
/// Bytes per band of one pixel (1 for 8-bit, 2 for 16-bit images).
int cvips_band_bytes(const cvips_image *image);
/// The loader libvips chose ("pngload_buffer", ...), or NULL. Valid while the image is.
const char *cvips_loader(const cvips_image *image);
/// Whether the image carries a metadata field of this name ("exif-data", "orientation", ...).
int cvips_has_field(const cvips_image *image, const char *name);
/// An integer field, or fallback when there is none.
int cvips_int_field(const cvips_image *image, const char *name, int fallback);

/// Decodes every pixel into memory (the whole file is read: a truncated image fails here).
cvips_image *cvips_decode(cvips_image *image);
/// Turns the image upright by its EXIF orientation and removes the orientation field.
cvips_image *cvips_autorotate(cvips_image *image);
/// Converts to sRGB: through the embedded ICC profile when there is a usable one, from CMYK
/// otherwise; any other image is returned as it is (a new reference).
cvips_image *cvips_to_srgb(cvips_image *image);
/// Flattens an alpha channel onto white (for JPEG, which has none); without alpha, the image.
cvips_image *cvips_flatten(cvips_image *image);
/// A copy with every metadata field removed (EXIF, XMP, IPTC, ICC, comments, orientation...).
cvips_image *cvips_strip(cvips_image *image);
/// A size x size square: scaled to cover the square, then its centre cut out.
cvips_image *cvips_square_thumbnail(cvips_image *image, int size);

/// cvips_square_thumbnail of an encoded image, decoding only as much as the size needs (JPEG
/// and WebP decode at a fraction of their size). libvips reads the bytes lazily and does not copy
/// them: they must stay valid until the returned image has been encoded and released.
cvips_image *cvips_square_thumbnail_of_bytes(const void *bytes, size_t length, int size);

/// Encodes the image. With keep_metadata 0 nothing but pixels is written (no EXIF, XMP, IPTC,
/// ICC profile or comments); 1 writes the image's metadata (tests make files with EXIF this
/// way). quality is for JPEG, WebP and HEIC (1 to 100). On success *bytes (release with
/// cvips_free) and *length are set and 0 is returned.
int cvips_save(cvips_image *image, cvips_format format, int quality, int keep_metadata, void **bytes, size_t *length);

void cvips_free(void *bytes);
void cvips_release(cvips_image *image);

// For tests, which make their own images.

/// An 8-bit image of width x height pixels with bands bands, copied from pixels (row by row,
/// bands interleaved; length must be width * height * bands).
cvips_image *cvips_from_pixels(const void *pixels, size_t length, int width, int height, int bands);
/// Sets a binary metadata field (such as "exif-data") to a copy of bytes.
void cvips_set_blob(cvips_image *image, const char *name, const void *bytes, size_t length);
/// Sets a text metadata field (such as "png-comment-0-Comment").
void cvips_set_string(cvips_image *image, const char *name, const char *value);
/// Sets an integer metadata field (such as "orientation").
void cvips_set_int(cvips_image *image, const char *name, int value);
/// The bands of the pixel at x, y, as doubles, into values (at most capacity of them). Returns
/// how many bands there are, or -1.
int cvips_pixel(cvips_image *image, int x, int y, double *values, int capacity);

#endif
