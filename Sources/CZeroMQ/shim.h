#ifndef CZEROMQ_SHIM_H
#define CZEROMQ_SHIM_H
#include <zmq.h>
// The ZeroMQ bus wakes its I/O thread with an eventfd polled next to the sockets.
#include <sys/eventfd.h>
#endif
