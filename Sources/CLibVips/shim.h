#ifndef CLIBVIPS_SHIM_H
#define CLIBVIPS_SHIM_H
// libvips itself, found with pkg-config `vips` (Debian: libvips-dev). Only the C target `CVips`
// includes it; Swift code imports `CVips`, which wraps libvips's variadic calls.
#include <vips/vips.h>
#endif
