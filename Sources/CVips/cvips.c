#include "cvips.h"

#include <pthread.h>
#include <string.h>
#include <vips/vips.h>

// libvips 8.15 replaced the savers' `strip` flag with `keep`; both mean "write no metadata" here.
#if VIPS_MAJOR_VERSION > 8 || (VIPS_MAJOR_VERSION == 8 && VIPS_MINOR_VERSION >= 15)
#define CVIPS_METADATA(keep) "keep", ((keep) ? VIPS_FOREIGN_KEEP_ALL : VIPS_FOREIGN_KEEP_NONE)
#else
#define CVIPS_METADATA(keep) "strip", ((keep) ? FALSE : TRUE)
#endif

#define IMAGE(image) ((VipsImage *)(image))
#define WRAP(image) ((cvips_image *)(image))

// The buffer loaders of the kinds we accept. Every other loader (GIF, TIFF, SVG, PDF, FITS,
// Matlab, ImageMagick, the file and source loaders...) stays blocked.
static const char *const allowed_loaders[] = {
    "VipsForeignLoadPngBuffer",
    "VipsForeignLoadJpegBuffer",
    "VipsForeignLoadWebpBuffer",
    "VipsForeignLoadHeifBuffer",
};

static pthread_once_t start_once = PTHREAD_ONCE_INIT;
static const char *start_program = "onboarding";
static int start_result = -1;

static void ignore_log(const gchar *domain, GLogLevelFlags level, const gchar *message, gpointer data) {
    (void)domain;
    (void)level;
    (void)message;
    (void)data;
}

static void start(void) {
    if (vips_init(start_program) != 0) return;
    // Warnings (a truncated file, a damaged chunk) go to stderr by default, once per tile; the
    // errors that matter come back through the error buffer instead.
    g_log_set_handler("VIPS", G_LOG_LEVEL_WARNING | G_LOG_LEVEL_MESSAGE | G_LOG_LEVEL_INFO | G_LOG_LEVEL_DEBUG,
                      ignore_log, NULL);
    vips_leak_set(FALSE);
    // One worker per pipeline: the service's own decode threads are the only parallelism.
    vips_concurrency_set(1);
    // Nothing is ever decoded twice, so the operation cache would only hold memory.
    vips_cache_set_max(0);
    vips_cache_set_max_mem(0);
    vips_cache_set_max_files(0);
    vips_block_untrusted_set(TRUE);
    vips_operation_block_set("VipsForeignLoad", TRUE);
    for (size_t i = 0; i < sizeof(allowed_loaders) / sizeof(allowed_loaders[0]); i++) {
        vips_operation_block_set(allowed_loaders[i], FALSE);
    }
    start_result = 0;
}

int cvips_start(const char *program) {
    if (program != NULL) start_program = program;
    pthread_once(&start_once, start);
    return start_result;
}

void cvips_take_error(char *buffer, size_t size) {
    if (size == 0) return;
    const char *text = vips_error_buffer();
    size_t length = text ? strlen(text) : 0;
    if (length >= size) length = size - 1;
    if (length > 0) memcpy(buffer, text, length);
    buffer[length] = '\0';
    vips_error_clear();
}

size_t cvips_tracked_memory_peak(void) { return vips_tracked_get_mem_highwater(); }

cvips_image *cvips_open(const void *bytes, size_t length) {
    VipsImage *image = vips_image_new_from_buffer(bytes, length, "", "access", VIPS_ACCESS_SEQUENTIAL, "fail_on",
                                                  VIPS_FAIL_ON_ERROR, NULL);
    return WRAP(image);
}

int cvips_width(const cvips_image *image) { return vips_image_get_width(IMAGE(image)); }
int cvips_height(const cvips_image *image) { return vips_image_get_height(IMAGE(image)); }
int cvips_bands(const cvips_image *image) { return vips_image_get_bands(IMAGE(image)); }
int cvips_band_bytes(const cvips_image *image) { return (int)vips_format_sizeof(vips_image_get_format(IMAGE(image))); }

const char *cvips_loader(const cvips_image *image) {
    const char *loader = NULL;
    if (vips_image_get_string(IMAGE(image), VIPS_META_LOADER, &loader) != 0) {
        vips_error_clear();
        return NULL;
    }
    return loader;
}

int cvips_has_field(const cvips_image *image, const char *name) {
    return vips_image_get_typeof(IMAGE(image), name) != 0;
}

int cvips_int_field(const cvips_image *image, const char *name, int fallback) {
    int value = fallback;
    if (vips_image_get_typeof(IMAGE(image), name) == 0) return fallback;
    if (vips_image_get_int(IMAGE(image), name, &value) != 0) {
        vips_error_clear();
        return fallback;
    }
    return value;
}

cvips_image *cvips_decode(cvips_image *image) { return WRAP(vips_image_copy_memory(IMAGE(image))); }

cvips_image *cvips_autorotate(cvips_image *image) {
    VipsImage *out = NULL;
    if (vips_autorot(IMAGE(image), &out, NULL) != 0) return NULL;
    return WRAP(out);
}

cvips_image *cvips_to_srgb(cvips_image *image) {
    VipsImage *in = IMAGE(image);
    VipsImage *out = NULL;
    if (vips_image_get_typeof(in, VIPS_META_ICC_NAME) != 0) {
        if (vips_icc_transform(in, &out, "srgb", "embedded", TRUE, "intent", VIPS_INTENT_RELATIVE, NULL) == 0) {
            return WRAP(out);
        }
        // A profile libvips cannot use: the pixels are taken as they are.
        vips_error_clear();
    }
    if (vips_image_guess_interpretation(in) == VIPS_INTERPRETATION_CMYK) {
        if (vips_colourspace(in, &out, VIPS_INTERPRETATION_sRGB, NULL) != 0) return NULL;
        return WRAP(out);
    }
    g_object_ref(in);
    return WRAP(in);
}

cvips_image *cvips_flatten(cvips_image *image) {
    VipsImage *in = IMAGE(image);
    if (!vips_image_hasalpha(in)) {
        g_object_ref(in);
        return WRAP(in);
    }
    double max_alpha = vips_image_get_format(in) == VIPS_FORMAT_USHORT ? 65535.0 : 255.0;
    VipsArrayDouble *white = vips_array_double_newv(1, max_alpha);
    VipsImage *out = NULL;
    int result = vips_flatten(in, &out, "background", white, "max_alpha", max_alpha, NULL);
    vips_area_unref(VIPS_AREA(white));
    return result == 0 ? WRAP(out) : NULL;
}

cvips_image *cvips_strip(cvips_image *image) {
    VipsImage *out = NULL;
    if (vips_copy(IMAGE(image), &out, NULL) != 0) return NULL;
    // Every field name, the built-in ones (width, bands...) among them; vips_image_remove leaves
    // those alone and removes the rest.
    gchar **fields = vips_image_get_fields(out);
    for (gchar **field = fields; field && *field; field++) {
        // A hint libvips keeps for itself (never written to a file); without it, thumbnailing
        // a decoded image takes several times as long.
        if (strcmp(*field, "vips-sequential") == 0) continue;
        vips_image_remove(out, *field);
    }
    g_strfreev(fields);
    return WRAP(out);
}

cvips_image *cvips_square_thumbnail(cvips_image *image, int size) {
    VipsImage *out = NULL;
    if (vips_thumbnail_image(IMAGE(image), &out, size, "height", size, "crop", VIPS_INTERESTING_CENTRE, "size",
                             VIPS_SIZE_BOTH, NULL) != 0) {
        return NULL;
    }
    return WRAP(out);
}

cvips_image *cvips_square_thumbnail_of_bytes(const void *bytes, size_t length, int size) {
    VipsImage *out = NULL;
    if (vips_thumbnail_buffer((void *)bytes, length, &out, size, "height", size, "crop", VIPS_INTERESTING_CENTRE,
                              "size", VIPS_SIZE_BOTH, NULL) != 0) {
        return NULL;
    }
    return WRAP(out);
}

int cvips_save(cvips_image *image, cvips_format format, int quality, int keep_metadata, void **bytes,
               size_t *length) {
    VipsImage *in = IMAGE(image);
    *bytes = NULL;
    *length = 0;
    switch (format) {
    case CVIPS_PNG:
        return vips_pngsave_buffer(in, bytes, length, CVIPS_METADATA(keep_metadata), NULL);
    case CVIPS_JPEG:
        return vips_jpegsave_buffer(in, bytes, length, "Q", quality, CVIPS_METADATA(keep_metadata), NULL);
    case CVIPS_WEBP:
        return vips_webpsave_buffer(in, bytes, length, "Q", quality, CVIPS_METADATA(keep_metadata), NULL);
    case CVIPS_HEIC:
        return vips_heifsave_buffer(in, bytes, length, "Q", quality, "compression",
                                    VIPS_FOREIGN_HEIF_COMPRESSION_HEVC, CVIPS_METADATA(keep_metadata), NULL);
    }
    vips_error("cvips", "unknown format %d", (int)format);
    return -1;
}

void cvips_free(void *bytes) { g_free(bytes); }

void cvips_release(cvips_image *image) {
    if (image) g_object_unref(IMAGE(image));
}

cvips_image *cvips_from_pixels(const void *pixels, size_t length, int width, int height, int bands) {
    VipsImage *image = vips_image_new_from_memory_copy(pixels, length, width, height, bands, VIPS_FORMAT_UCHAR);
    if (image && bands >= 3) image->Type = VIPS_INTERPRETATION_sRGB;
    return WRAP(image);
}

void cvips_set_blob(cvips_image *image, const char *name, const void *bytes, size_t length) {
    vips_image_set_blob_copy(IMAGE(image), name, bytes, length);
}

void cvips_set_string(cvips_image *image, const char *name, const char *value) {
    vips_image_set_string(IMAGE(image), name, value);
}

void cvips_set_int(cvips_image *image, const char *name, int value) { vips_image_set_int(IMAGE(image), name, value); }

int cvips_pixel(cvips_image *image, int x, int y, double *values, int capacity) {
    double *vector = NULL;
    int count = 0;
    if (vips_getpoint(IMAGE(image), &vector, &count, x, y, NULL) != 0) return -1;
    for (int i = 0; i < count && i < capacity; i++) values[i] = vector[i];
    g_free(vector);
    return count;
}
