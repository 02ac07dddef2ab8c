/*
 * The C API of scale0.core._pool (scale0/core/_pool.c), for the lane (scale0/net/_lane.c):
 * a PyCapsule named S0_POOL_CAPSULE ("scale0.core._pool._C_API", PyCapsule_Import) holding one
 * s0_pool_api. Every function but pool_of is plain C over a `struct s0_pool *`: no Python API,
 * no GIL; the caller serialises access (the lane's lock, scale0/net/_lane.c "One lock").
 * Byte strings are the caller's (data, length); the pool hashes them with its own key.
 */
#ifndef S0_POOL_API_H
#define S0_POOL_API_H

#include <stddef.h>

#define S0_POOL_CAPSULE "scale0.core._pool._C_API"
#define S0_POOL_API_VERSION 3

struct s0_pool;

typedef struct {
    int version; /* S0_POOL_API_VERSION */
    /* The pool of a scale0.core._pool.Pool object (a PyObject *), NULL if `obj` is not one.
     * The GIL is needed for this one; the pool lives as long as the object. */
    struct s0_pool *(*pool_of)(void *obj);
    /* The routing id of the least recently used worker with a free slot for `service`
     * (Pool.queue(service)[0]) without taking it, NULL if none; *rid_len set. The pointer is
     * the pool's: valid until the pool next changes. */
    const unsigned char *(*peek)(struct s0_pool *, const void *service, size_t len,
                                 size_t *rid_len);
    /* Pool.take(service): the same worker peek names, marked used; NULL if none. */
    const unsigned char *(*take)(struct s0_pool *, const void *service, size_t len,
                                 size_t *rid_len);
    /* Pool.hold: 0, -1 out of memory (nothing changed), -2 unknown worker. */
    int (*hold)(struct s0_pool *, const void *rid, size_t rid_len, const void *ticket,
                size_t ticket_len);
    /* Pool.release: 1 released, 0 it did not hold it (or the worker is unknown). */
    int (*release)(struct s0_pool *, const void *rid, size_t rid_len, const void *ticket,
                   size_t ticket_len);
    /* Pool.list_ready (nothing if the worker is unknown). */
    void (*list_ready)(struct s0_pool *, const void *rid, size_t rid_len);
    /* Pool.used: tickets held, 0 if unknown. */
    long long (*used)(struct s0_pool *, const void *rid, size_t rid_len);
    /* While `guard` is set (not NULL), every Pool method raises RuntimeError when *guard is 0
     * (the lane's count of Python's holds of its lock); NULL clears it. */
    void (*set_guard)(struct s0_pool *, const int *guard);
    /* Pool.offered_count(service): workers offering it, ready or busy (version 2). */
    long long (*offered)(struct s0_pool *, const void *service, size_t len);
    /* The services the worker offers now, in its READY's order, duplicates dropped (the C
     * twin of Ledger.worker(rid).services; version 2): returns how many (0 if the worker is
     * unknown) and writes the first min(that, cap) names (UTF-8) into names/lens. The
     * pointers are the pool's: valid until the pool next changes. */
    size_t (*services_of)(struct s0_pool *, const void *rid, size_t rid_len,
                          const unsigned char **names, size_t *lens, size_t cap);
    /* Whether the worker's READY asked for request_ids (Pool.add's ids; version 3): 1 yes,
     * 0 no or unknown. */
    int (*ids_of)(struct s0_pool *, const void *rid, size_t rid_len);
    /* Pool.spare: capacity less the tickets held, below 0 when a READY lowered the capacity
     * under what the worker runs; 0 if unknown (version 3). */
    long long (*spare)(struct s0_pool *, const void *rid, size_t rid_len);
} s0_pool_api;

#endif
