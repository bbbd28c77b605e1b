#ifndef CLIBPQ_SHIM_H
#define CLIBPQ_SHIM_H
// PostgreSQL's own client library (Debian's libpq-dev): the stores send a transaction's
// statements in flights with its pipeline mode, which postgres-nio does not have.
#include <libpq-fe.h>
#include <poll.h>
#endif
