#ifndef CZEROMQ_SHIM_H
#define CZEROMQ_SHIM_H
#include <zmq.h>
// The ZeroMQ bus wakes its I/O thread with an eventfd polled next to the sockets.
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>

/// The bytes waiting in the kernel's send queue of the stream socket `fd` (sent and not yet
/// acknowledged, or not sent because the peer's window is closed), or -1 when it cannot be read.
/// A publisher looks at its subscribers' connections with it (their descriptors come from
/// libzmq's socket monitor): a queue that stays full belongs to a subscriber that does not read.
static inline int onboarding_send_queue_bytes(int fd) {
    int bytes = 0;
    return ioctl(fd, SIOCOUTQ, &bytes) == 0 ? bytes : -1;
}
#endif
