/*
 * mr_port.h - a TCP port for a listener that another process binds later.
 *
 * A port chosen now and bound seconds later (MASTER_PORT: rank 0's store
 * binds it after importing its framework; a test's server started later
 * on a port it was told) must not come from the kernel's ephemeral range
 * (ip_local_port_range): every outgoing connection on the host draws its
 * local port from there, a busy host holds hundreds at any moment, and
 * one taking the port in between makes the bind fail with EADDRINUSE.
 * torchrun's default port, 29500, sits below the range for the same
 * reason.
 *
 * Non-goals: reserving the port (nothing can: the binder is another
 * process), UDP.
 */
#ifndef MR_PORT_H
#define MR_PORT_H

/* A port free for a listener now (checked with SO_REUSEADDR, as stores
 * and servers bind), random in [MR_PORT_MIN, the ephemeral range's
 * start), so processes on one host rarely try the same one; -1 when none
 * there is free. */
#define MR_PORT_MIN 20000
int mr_port_free(void);

#endif
