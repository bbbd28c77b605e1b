#ifndef CZEROMQ_SHIM_H
#define CZEROMQ_SHIM_H
#include <zmq.h>
// The ZeroMQ bus wakes its I/O thread with an eventfd polled next to the sockets.
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>

/// The bytes in the kernel's send queue of the TCP socket `fd` that were not sent yet
/// (SIOCOUTQNSD: bytes in flight, sent and not yet acknowledged, do not count), or -1 when it
/// cannot be read. They pile up only while the peer's receive window is closed: a publisher
/// looks at its subscribers' connections with it (their descriptors come from libzmq's socket
/// monitor), and a queue that stays full belongs to a subscriber that does not read.
static inline int onboarding_send_queue_bytes(int fd) {
    int bytes = 0;
    return ioctl(fd, SIOCOUTQNSD, &bytes) == 0 ? bytes : -1;
}
#endif
