#ifndef CLIBVIPS_SHIM_H
#define CLIBVIPS_SHIM_H
// libvips itself (Debian: libvips-dev), in /usr/include; GLib's headers, which it includes, are
// found with pkg-config `gobject-2.0`. Only the C target `CVips` includes it; Swift code imports
// `CVips`, which wraps libvips's variadic calls.
#include <vips/vips.h>
#endif
