/*
 * scale0.core._pool: the worker pool (scale0/core/workers.py's WorkerPool) in C.
 *
 * Phase 2's first brick of the decided C lane (docs/architecture.md, "Decided, being built"). It
 * keeps, in C memory, the state a lane thread needs to route a REQUEST to a worker and take its
 * REPLY back: the workers by routing id, with their services, capacity and the tickets they
 * hold; per service, the workers with a free slot, least recently used first; per service, how
 * many workers offer it. tests/core/test_pool_parity.py holds it to WorkerPool with a Hypothesis
 * state machine that compares every answer and the observable state after every step. The
 * broker's ledger keeps its pool here where this is built (scale0/core/ledger.py's
 * CPoolLedger: Ledger(pool="c"), the default unless SCALE0_POOL=python or SCALE0_PURE=1).
 *
 *   Pool()
 *   add(routing_id, services, capacity, ids=False) -> bool     a READY: True when it replaced a
 *       known worker, whose tickets the new registration keeps (WorkerPool.add); the worker is
 *       listed nowhere until list_ready. services: a tuple (or list) of str, duplicates counted
 *       once; capacity: int >= 1; ids (bool, keyword or 4th positional): its READY asked for
 *       request_ids (a new add replaces it with the rest).
 *   remove(routing_id) -> list[bytes] | None        the tickets it held (sorted), None if unknown
 *   offers(service) -> bool                         any worker, ready or busy, offers it
 *   offered_count(service) -> int                   how many workers offer it (Ledger.workers_of)
 *   services() -> list[str]                         every offered service, sorted
 *   ready_count(service) -> int                     workers with a free slot for it
 *   queue(service) -> list[bytes]                   their routing ids, least recently used first
 *   take(service) -> bytes | None                   the LRU worker with room for it: to the back
 *       of that queue if it has room left after this dispatch, else out of every queue
 *   hold(routing_id, ticket)                        the worker runs `ticket` (KeyError: unknown)
 *   release(routing_id, ticket) -> bool             it no longer does; False if it did not
 *   list_ready(routing_id)                          to the back of each of its services' queues
 *       if it is registered and has a free slot; out of all of them if it is full (R5: it was
 *       given requests outside take); nothing if it is unknown
 *   tickets(routing_id) -> list[bytes]              sorted (KeyError: unknown)
 *   spare(routing_id) -> int                        capacity - tickets held (KeyError: unknown)
 *   used(routing_id) -> int                         tickets held; 0 if unknown (a worker the
 *       pool does not know holds no slot): Ledger.used and Ledger.spare, one call, no KeyError
 *   worker_count() -> int
 *   ids_of(routing_id) -> bool                      its last add's ids; False if unknown
 *
 * Every argument is checked before the first change: a wrong type raises TypeError naming the
 * argument, a capacity below 1 (or above 2**62) ValueError, and a failed allocation
 * MemoryError with the pool unchanged.
 *
 * Memory ownership. The pool holds no Python object: routing ids, service names (UTF-8; a str
 * that is not encodable is taken with "surrogatepass", so every str round-trips as
 * WorkerPool's dict keys do) and tickets are copied into C memory the pool owns, each key in
 * the same allocation as the record it names. A worker owns its array of links (one per
 * service) and its table of tickets; a service record lives while at least one worker offers
 * it, and is freed when the last one goes (its queue is empty by then). Pool's dealloc frees
 * everything. The Python methods are thin wrappers: they convert and check arguments, call the
 * pool_* functions below (plain C, no Python API, no GIL needed) and build the answer from C
 * memory. So the type needs no GC support. One rule for the wrappers: no pointer into the pool
 * is kept across the allocation of a list (or any object the cyclic GC tracks), because that
 * allocation may run a collection, so finalizers, so Python code calling this very pool; the
 * answers that need a list allocate it, then look the record up again and check its size
 * (tests/core/test_pool_parity.py arms the collector inside each such call).
 *
 * Structures and complexity. Hash tables (scale0/_table.h): open addressing, linear probing,
 * backward-shift deletion (no tombstones), power-of-two sizes at most 3/4 full, keys hashed by
 * SipHash-1-3 under a per-process random key (routing ids and tickets come from peers; a
 * chosen-collision flood must not make a lookup O(n)). The key reaches no answer, as Python's
 * hash seed reaches none of WorkerPool's: every answer comes in an order the pool defines (LRU,
 * sorted), never in table order, so the core stays deterministic (DESIGN.md: no clock, no random
 * ids in core).
 * Tables grow, never shrink: their size follows the peak.
 * Per service an intrusive doubly linked list of the workers with a free slot: each worker has
 * one link per service it offers, so listing, unlisting and moving to the back are O(1) per
 * service with no search. take, release, hold, list_ready: O(1) per service of the worker
 * concerned (expected, as a hash lookup is); add: O(services of the old and the new READY);
 * remove: O(services + tickets); services() and queue(): O(answer) plus the sort.
 *
 * Threads: shared with a lane (phase 3b). The lane (scale0/net/_lane.c) shares a Pool with the
 * Python core: Lane.attach_pool(pool) keeps a reference and from then on its thread calls the
 * pool through the C API below, without the GIL, only while holding the lane's one (recursive)
 * lock; Python calls these methods only while holding it too (lane.lock()). The pool has no
 * lock of its own. To make a Python path that forgot the lock fail loudly, the lane sets the
 * pool's guard (set_guard) to its count of Python's holds of the lock: while a guard is set,
 * every method raises RuntimeError("the pool is shared with a lane: call it under lane.lock()")
 * when that count is 0, before it reads an argument. Detaching (attach_pool(None)) or the
 * lane's dealloc clears it; a Pool no lane shares has no guard (tests/core/test_pool_parity.py).
 *
 * The C API (scale0/core/_pool_api.h): the capsule scale0.core._pool._C_API holds an
 * s0_pool_api of function pointers: pool_of(Pool object) -> the pool (the GIL needed for this
 * one), and over that pool, plain C with no Python API: peek(service) (the LRU ready worker's
 * routing id, Pool.queue(service)[0], not taken), take, hold, release, list_ready, used (each
 * as the method of that name), set_guard(pool, const int *guard), and (API version 2, phase
 * 3b's second step) offered(service) (Pool.offered_count) and services_of(routing_id) (the
 * worker's services now, in its READY's order, duplicates dropped: what the lane's REPLY rule
 * reads, a READY since a dispatch may have changed them), and (version 3) ids_of(routing_id)
 * (1 its READY asked for request_ids, 0 no or unknown: whether the lane writes it IDREQUEST).
 * Byte strings are passed as (data, length) and hashed by the pool with its own key; a routing
 * id it returns points into the pool and is valid until the pool next changes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Hashing (SipHash-1-3) and the open-addressing tables, shared with the lane
 * (scale0/net/_lane.c). */
#include "../_table.h"
#include "_pool_api.h"

/* ---- the pool --------------------------------------------------------------------------- */

typedef struct s0_worker s0_worker;
typedef struct s0_service s0_service;

/* A worker's place in one service's queue of ready workers. */
typedef struct s0_link {
    s0_worker *worker;
    s0_service *service;
    struct s0_link *prev, *next;
    int listed;
} s0_link;

struct s0_service {
    s0_key key; /* the name, UTF-8 */
    Py_ssize_t offered; /* workers offering it; the record is freed at 0 */
    Py_ssize_t ready;   /* links in the queue */
    s0_link *head, *tail; /* least recently used first */
};

struct s0_worker {
    s0_key key; /* the routing id */
    long long capacity;
    int ids; /* its READY asked for request_ids (add's ids; a new add replaces it) */
    size_t n_links;
    s0_link *links; /* one per service, in READY order, duplicates dropped */
    s0_table tickets; /* of s0_key records: the tickets it runs */
};

typedef struct s0_pool {
    s0_table workers;
    s0_table services;
    const int *guard; /* set by a lane sharing this pool (set_guard): see "Threads" */
} s0_pool;

/* A byte string the caller owns, and its hash. */
typedef struct {
    const unsigned char *data;
    size_t len;
    uint64_t hash;
} s0_bytes;

static void link_append(s0_link *l) {
    s0_service *s = l->service;
    l->prev = s->tail;
    l->next = NULL;
    if (s->tail)
        s->tail->next = l;
    else
        s->head = l;
    s->tail = l;
    l->listed = 1;
    s->ready++;
}

static void link_unlink(s0_link *l) {
    s0_service *s = l->service;
    if (l->prev)
        l->prev->next = l->next;
    else
        s->head = l->next;
    if (l->next)
        l->next->prev = l->prev;
    else
        s->tail = l->prev;
    l->prev = l->next = NULL;
    l->listed = 0;
    s->ready--;
}

static void worker_unlist(s0_worker *w) {
    for (size_t i = 0; i < w->n_links; i++)
        if (w->links[i].listed)
            link_unlink(&w->links[i]);
}

/* Drop the worker's claim on its services (unlisted first): a service nobody offers is freed. */
static void worker_uncount(s0_pool *p, s0_worker *w) {
    for (size_t i = 0; i < w->n_links; i++) {
        s0_service *s = w->links[i].service;
        if (--s->offered == 0) {
            table_remove(&p->services, &s->key);
            free(s);
        }
    }
}

static long long worker_spare(const s0_worker *w) {
    return w->capacity - (long long)w->tickets.used;
}

static void tickets_free(s0_table *t) {
    if (t->slots != NULL)
        for (size_t i = 0; i <= t->mask; i++)
            free(t->slots[i]);
    free(t->slots);
    t->slots = NULL;
    t->used = 0;
}

static s0_worker *pool_worker(const s0_pool *p, const s0_bytes *rid) {
    return (s0_worker *)table_find(&p->workers, rid->data, rid->len, rid->hash);
}

static s0_service *pool_service(const s0_pool *p, const s0_bytes *name) {
    return (s0_service *)table_find(&p->services, name->data, name->len, name->hash);
}

/* Register a worker, or replace a known one's services and capacity keeping its tickets (a new
 * READY); it is listed nowhere until pool_list_ready. `names` may repeat a name: it counts once.
 * 0, *replaced set; -1 when out of memory, the pool unchanged. */
static int pool_add(s0_pool *p, const s0_bytes *rid, const s0_bytes *names, size_t n,
                    long long capacity, int ids, int *replaced) {
    s0_link *links = NULL;
    s0_service **fresh = NULL;
    size_t *probe = NULL;
    size_t n_links = 0, n_fresh = 0, i;
    s0_worker *created = NULL;

    if (n) {
        links = calloc(n, sizeof(s0_link));
        fresh = calloc(n, sizeof(s0_service *));
        /* Duplicates, found through a small index of the names seen (open addressing). */
        size_t size = 8;
        while (size < 2 * n)
            size *= 2;
        probe = malloc(size * sizeof(size_t));
        if (links == NULL || fresh == NULL || probe == NULL)
            goto nomem;
        for (i = 0; i < size; i++)
            probe[i] = SIZE_MAX;
        for (i = 0; i < n; i++) {
            const s0_bytes *name = &names[i];
            size_t j = name->hash & (size - 1);
            int dup = 0;
            for (; probe[j] != SIZE_MAX; j = (j + 1) & (size - 1)) {
                const s0_bytes *seen = &names[probe[j]];
                if (seen->hash == name->hash && seen->len == name->len &&
                    (name->len == 0 || memcmp(seen->data, name->data, name->len) == 0)) {
                    dup = 1;
                    break;
                }
            }
            if (dup)
                continue;
            probe[j] = i;
            s0_service *s = pool_service(p, name);
            if (s == NULL) {
                s = record_new(sizeof(s0_service), name->data, name->len, name->hash);
                if (s == NULL)
                    goto nomem;
                fresh[n_fresh++] = s;
            }
            links[n_links++].service = s;
        }
        if (table_reserve(&p->services, n_fresh) < 0)
            goto nomem;
    }
    s0_worker *w = pool_worker(p, rid);
    if (w == NULL) {
        created = record_new(sizeof(s0_worker), rid->data, rid->len, rid->hash);
        if (created == NULL || table_reserve(&p->workers, 1) < 0)
            goto nomem;
    }
    /* Nothing below fails. */
    for (i = 0; i < n_fresh; i++)
        table_insert(&p->services, &fresh[i]->key);
    for (i = 0; i < n_links; i++)
        links[i].service->offered++;
    if (w != NULL) {
        worker_unlist(w);
        worker_uncount(p, w); /* after the new counts: a service kept is never freed */
        free(w->links);
    } else {
        w = created;
        table_insert(&p->workers, &w->key);
    }
    for (i = 0; i < n_links; i++)
        links[i].worker = w;
    w->links = links;
    w->n_links = n_links;
    w->capacity = capacity;
    w->ids = ids;
    *replaced = created == NULL;
    free(fresh);
    free(probe);
    return 0;

nomem:
    for (i = 0; i < n_fresh; i++)
        free(fresh[i]);
    free(created);
    free(links);
    free(fresh);
    free(probe);
    return -1;
}

static void pool_remove(s0_pool *p, s0_worker *w) {
    worker_unlist(w);
    worker_uncount(p, w);
    table_remove(&p->workers, &w->key);
    tickets_free(&w->tickets);
    free(w->links);
    free(w);
}

static s0_worker *pool_take(s0_pool *p, const s0_bytes *name) {
    s0_service *s = pool_service(p, name);
    if (s == NULL || s->head == NULL)
        return NULL;
    s0_link *l = s->head;
    s0_worker *w = l->worker;
    if (worker_spare(w) > 1) { /* still has room after this dispatch: others go first */
        if (l != s->tail) {
            link_unlink(l);
            link_append(l);
        }
    } else {
        worker_unlist(w); /* full after this dispatch: out of every queue */
    }
    return w;
}

/* A full worker leaves every queue instead: it was given requests outside pool_take (as a worker
 * that frees a slot is given what waits, R5), and take would hand it one more than it holds. */
static void pool_list_ready(s0_worker *w) {
    if (worker_spare(w) <= 0) {
        worker_unlist(w);
        return;
    }
    for (size_t i = 0; i < w->n_links; i++) {
        s0_link *l = &w->links[i];
        if (l->listed) {
            if (l->service->tail == l)
                continue;
            link_unlink(l);
        }
        link_append(l);
    }
}

/* 0 (held now, or already), -1 out of memory (nothing changed). */
static int pool_hold(s0_worker *w, const s0_bytes *ticket) {
    if (table_find(&w->tickets, ticket->data, ticket->len, ticket->hash) != NULL)
        return 0;
    s0_key *k = record_new(sizeof(s0_key), ticket->data, ticket->len, ticket->hash);
    if (k == NULL || table_reserve(&w->tickets, 1) < 0) {
        free(k);
        return -1;
    }
    table_insert(&w->tickets, k);
    return 0;
}

static int pool_release(s0_worker *w, const s0_bytes *ticket) {
    s0_key *k = table_find(&w->tickets, ticket->data, ticket->len, ticket->hash);
    if (k == NULL)
        return 0;
    table_remove(&w->tickets, k);
    free(k);
    return 1;
}

static void pool_clear(s0_pool *p) {
    if (p->workers.slots != NULL)
        for (size_t i = 0; i <= p->workers.mask; i++) {
            s0_worker *w = (s0_worker *)p->workers.slots[i];
            if (w == NULL)
                continue;
            tickets_free(&w->tickets);
            free(w->links);
            free(w);
        }
    if (p->services.slots != NULL)
        for (size_t i = 0; i <= p->services.mask; i++)
            free(p->services.slots[i]);
    free(p->workers.slots);
    free(p->services.slots);
    memset(p, 0, sizeof(*p));
}

/* ---- the Python type -------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    s0_pool pool;
} PoolObject;

/* -1 with RuntimeError when a lane shares the pool and Python does not hold the lane's lock. */
static int unguarded(PoolObject *self) {
    const int *guard = self->pool.guard;
    if (guard != NULL && *guard == 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the pool is shared with a lane: call it under lane.lock()");
        return -1;
    }
    return 0;
}

/* bytes argument `what` of `method` into *out (borrowed from `obj`, which the caller holds). */
static int arg_bytes(PyObject *obj, const char *method, const char *what, s0_bytes *out) {
    if (!PyBytes_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "Pool.%s: %s must be bytes, not %.100s", method, what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    out->data = (const unsigned char *)PyBytes_AS_STRING(obj);
    out->len = (size_t)PyBytes_GET_SIZE(obj);
    out->hash = hash_bytes(out->data, out->len);
    return 0;
}

/* str argument into *out, its UTF-8 (cached in the str); a str UTF-8 cannot encode (lone
 * surrogates) goes through "surrogatepass" into *keep, a new bytes the caller releases. */
static int arg_str(PyObject *obj, const char *method, const char *what, s0_bytes *out,
                   PyObject **keep) {
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "Pool.%s: %s must be str, not %.100s", method, what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    Py_ssize_t len;
    const char *data = PyUnicode_AsUTF8AndSize(obj, &len);
    if (data == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return -1;
        PyErr_Clear();
        PyObject *b = PyUnicode_AsEncodedString(obj, "utf-8", "surrogatepass");
        if (b == NULL)
            return -1;
        *keep = b;
        data = PyBytes_AS_STRING(b);
        len = PyBytes_GET_SIZE(b);
    }
    out->data = (const unsigned char *)data;
    out->len = (size_t)len;
    out->hash = hash_bytes(out->data, out->len);
    return 0;
}

static PyObject *str_of(const s0_key *k) {
    return PyUnicode_DecodeUTF8((const char *)k->data, (Py_ssize_t)k->len, "surrogatepass");
}

static PyObject *bytes_of(const s0_key *k) {
    return PyBytes_FromStringAndSize((const char *)k->data, (Py_ssize_t)k->len);
}

static int nargs_ok(const char *method, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "Pool.%s takes %zd argument%s (%zd given)", method, want,
                 want == 1 ? "" : "s", nargs);
    return -1;
}

/* The worker named by args[0], or NULL with KeyError set when `must` (NULL, no error, if not). */
static s0_worker *arg_worker(PoolObject *self, PyObject *obj, const char *method, int must,
                             int *error) {
    s0_bytes rid;
    *error = 0;
    if (arg_bytes(obj, method, "routing_id", &rid) < 0) {
        *error = 1;
        return NULL;
    }
    s0_worker *w = pool_worker(&self->pool, &rid);
    if (w == NULL && must) {
        PyErr_Format(PyExc_KeyError, "Pool.%s: no worker %R", method, obj);
        *error = 1;
    }
    return w;
}

/* A list of `n` items whose allocation may run the cyclic GC, and so finalizers, and so any
 * Python code, this pool's methods included: the caller looks again at what it was copying
 * afterwards, and asks for a new list if its size changed (new_list_for). */
static PyObject *new_list_for(Py_ssize_t n) {
    return PyList_New(n);
}

/* `list`, made for exactly t->used items, filled with every key of `t` as `make` turns it into a
 * new bytes or str (objects the collector does not track: no Python code runs while the table
 * is read), then sorted; NULL, `list` released, on a failure. */
static PyObject *sorted_keys(PyObject *list, const s0_table *t,
                             PyObject *(*make)(const s0_key *)) {
    Py_ssize_t n = 0;
    if (t->slots != NULL)
        for (size_t i = 0; i <= t->mask; i++) {
            if (t->slots[i] == NULL)
                continue;
            PyObject *item = make(t->slots[i]);
            if (item == NULL) {
                Py_DECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(list, n++, item);
        }
    if (PyList_Sort(list) < 0) {
        Py_DECREF(list);
        return NULL;
    }
    return list;
}

/* The tickets of the worker `rid` (which must exist: *gone set, and NULL, if it does not). */
static PyObject *sorted_tickets(PoolObject *self, const s0_bytes *rid, int *gone) {
    const s0_worker *w;
    PyObject *list;
    *gone = 0;
    for (;;) {
        w = pool_worker(&self->pool, rid);
        if (w == NULL) {
            *gone = 1;
            return NULL;
        }
        Py_ssize_t want = (Py_ssize_t)w->tickets.used;
        list = new_list_for(want);
        if (list == NULL)
            return NULL;
        w = pool_worker(&self->pool, rid); /* the same, unless a finalizer changed the pool */
        if (w != NULL && (Py_ssize_t)w->tickets.used == want)
            break;
        Py_DECREF(list);
    }
    return sorted_keys(list, &w->tickets, bytes_of);
}

static PyObject *Pool_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Pool() takes no arguments");
        return NULL;
    }
    PoolObject *self = (PoolObject *)type->tp_alloc(type, 0);
    if (self != NULL)
        memset(&self->pool, 0, sizeof(self->pool));
    return (PyObject *)self;
}

static void Pool_dealloc(PoolObject *self) {
    pool_clear(&self->pool);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Pool_add(PoolObject *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames) {
    if (unguarded(self) < 0)
        return NULL;
    /* (routing_id, services, capacity, ids=False): ids positional 4th or keyword */
    PyObject *ids_obj = nargs == 4 ? args[3] : NULL;
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        if (ids_obj != NULL && PyUnicode_Check(name) &&
            PyUnicode_CompareWithASCIIString(name, "ids") == 0) {
            PyErr_SetString(PyExc_TypeError, "Pool.add: got multiple values for argument 'ids'");
            return NULL;
        }
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, "ids") != 0) {
            PyErr_Format(PyExc_TypeError,
                         "Pool.add: unexpected keyword argument %R (add(routing_id, services, "
                         "capacity, ids=False))",
                         name);
            return NULL;
        }
        ids_obj = args[nargs + k];
    }
    if (nargs != 3 && nargs != 4) {
        PyErr_Format(PyExc_TypeError,
                     "Pool.add takes 3 arguments (%zd given), and ids=False (4th or keyword)",
                     nargs);
        return NULL;
    }
    int ids = 0;
    if (ids_obj != NULL) {
        if (!PyBool_Check(ids_obj)) {
            PyErr_Format(PyExc_TypeError, "Pool.add: ids must be bool, not %.100s",
                         Py_TYPE(ids_obj)->tp_name);
            return NULL;
        }
        ids = ids_obj == Py_True;
    }
    s0_bytes rid;
    if (arg_bytes(args[0], "add", "routing_id", &rid) < 0)
        return NULL;
    PyObject *services = args[1];
    if (!PyTuple_Check(services) && !PyList_Check(services)) {
        PyErr_Format(PyExc_TypeError, "Pool.add: services must be a tuple of str, not %.100s",
                     Py_TYPE(services)->tp_name);
        return NULL;
    }
    PyObject *capacity_obj = args[2];
    if (!PyLong_Check(capacity_obj) || PyBool_Check(capacity_obj)) {
        PyErr_Format(PyExc_TypeError, "Pool.add: capacity must be int, not %.100s",
                     Py_TYPE(capacity_obj)->tp_name);
        return NULL;
    }
    int overflow;
    long long capacity = PyLong_AsLongLongAndOverflow(capacity_obj, &overflow);
    if (capacity == -1 && PyErr_Occurred())
        return NULL;
    if (overflow || capacity < 1 || capacity > ((long long)1 << 62)) {
        PyErr_Format(PyExc_ValueError,
                     "Pool.add: capacity must be at least 1 (and at most 2**62), not %R",
                     capacity_obj);
        return NULL;
    }
    /* A list could change while its items are converted (they are str: no code runs, but
     * hold a tuple anyway); keep[i] holds a "surrogatepass" encoding when one was needed. */
    PyObject *seq = PySequence_Tuple(services);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    s0_bytes *names = NULL;
    PyObject **keep = NULL;
    PyObject *result = NULL;
    if (n) {
        names = PyMem_Calloc((size_t)n, sizeof(s0_bytes));
        keep = PyMem_Calloc((size_t)n, sizeof(PyObject *));
        if (names == NULL || keep == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i);
        if (!PyUnicode_Check(item)) {
            PyErr_Format(PyExc_TypeError,
                         "Pool.add: services[%zd] must be str, not %.100s", i,
                         Py_TYPE(item)->tp_name);
            goto done;
        }
        if (arg_str(item, "add", "services item", &names[i], &keep[i]) < 0)
            goto done;
    }
    int replaced = 0;
    if (pool_add(&self->pool, &rid, names, (size_t)n, capacity, ids, &replaced) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyBool_FromLong(replaced);
done:
    if (keep != NULL)
        for (Py_ssize_t i = 0; i < n; i++)
            Py_XDECREF(keep[i]);
    PyMem_Free(keep);
    PyMem_Free(names);
    Py_DECREF(seq);
    return result;
}

static PyObject *Pool_remove(PoolObject *self, PyObject *arg) {
    if (unguarded(self) < 0)
        return NULL;
    s0_bytes rid;
    int gone;
    if (arg_bytes(arg, "remove", "routing_id", &rid) < 0)
        return NULL;
    PyObject *tickets = sorted_tickets(self, &rid, &gone);
    if (gone)
        Py_RETURN_NONE;
    if (tickets == NULL)
        return NULL;
    s0_worker *w = pool_worker(&self->pool, &rid); /* (sorting bytes runs no Python code) */
    pool_remove(&self->pool, w);
    return tickets;
}

/* The service named by `arg` (a str), NULL if none; *error set on a bad argument. */
static s0_service *arg_service(PoolObject *self, PyObject *arg, const char *method,
                               int *error) {
    s0_bytes name;
    PyObject *keep = NULL;
    *error = 0;
    if (arg_str(arg, method, "service", &name, &keep) < 0) {
        *error = 1;
        return NULL;
    }
    s0_service *s = pool_service(&self->pool, &name);
    Py_XDECREF(keep);
    return s;
}

static PyObject *Pool_offers(PoolObject *self, PyObject *arg) {
    if (unguarded(self) < 0)
        return NULL;
    int error;
    s0_service *s = arg_service(self, arg, "offers", &error);
    if (error)
        return NULL;
    return PyBool_FromLong(s != NULL);
}

static PyObject *Pool_offered_count(PoolObject *self, PyObject *arg) {
    if (unguarded(self) < 0)
        return NULL;
    int error;
    s0_service *s = arg_service(self, arg, "offered_count", &error);
    if (error)
        return NULL;
    return PyLong_FromSsize_t(s ? s->offered : 0);
}

static PyObject *Pool_ready_count(PoolObject *self, PyObject *arg) {
    if (unguarded(self) < 0)
        return NULL;
    int error;
    s0_service *s = arg_service(self, arg, "ready_count", &error);
    if (error)
        return NULL;
    return PyLong_FromSsize_t(s ? s->ready : 0);
}

static PyObject *Pool_queue(PoolObject *self, PyObject *arg) {
    if (unguarded(self) < 0)
        return NULL;
    s0_bytes name;
    PyObject *keep = NULL, *list;
    s0_service *s;
    if (arg_str(arg, "queue", "service", &name, &keep) < 0)
        return NULL;
    for (;;) {
        s = pool_service(&self->pool, &name);
        Py_ssize_t want = s ? s->ready : 0;
        list = new_list_for(want);
        if (list == NULL)
            break;
        s = pool_service(&self->pool, &name);
        if ((s ? s->ready : 0) == want)
            break;
        Py_DECREF(list);
    }
    Py_XDECREF(keep);
    if (list == NULL || s == NULL)
        return list;
    Py_ssize_t n = 0;
    for (s0_link *l = s->head; l != NULL; l = l->next) {
        PyObject *b = bytes_of(&l->worker->key);
        if (b == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, n++, b);
    }
    return list;
}

static PyObject *Pool_services(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
    if (unguarded(self) < 0)
        return NULL;
    const s0_table *t = &self->pool.services;
    PyObject *list;
    for (;;) {
        Py_ssize_t want = (Py_ssize_t)t->used;
        list = new_list_for(want);
        if (list == NULL)
            return NULL;
        if ((Py_ssize_t)t->used == want) /* (a changed table keeps its count honest) */
            break;
        Py_DECREF(list);
    }
    return sorted_keys(list, t, str_of);
}

static PyObject *Pool_take(PoolObject *self, PyObject *arg) {
    if (unguarded(self) < 0)
        return NULL;
    s0_bytes name;
    PyObject *keep = NULL;
    if (arg_str(arg, "take", "service", &name, &keep) < 0)
        return NULL;
    s0_worker *w = pool_take(&self->pool, &name);
    Py_XDECREF(keep);
    if (w == NULL)
        Py_RETURN_NONE;
    return bytes_of(&w->key);
}

static PyObject *Pool_hold(PoolObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (unguarded(self) < 0)
        return NULL;
    if (nargs_ok("hold", nargs, 2) < 0)
        return NULL;
    s0_bytes ticket;
    if (arg_bytes(args[1], "hold", "ticket", &ticket) < 0)
        return NULL;
    int error;
    s0_worker *w = arg_worker(self, args[0], "hold", 1, &error);
    if (error)
        return NULL;
    if (pool_hold(w, &ticket) < 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *Pool_release(PoolObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (unguarded(self) < 0)
        return NULL;
    if (nargs_ok("release", nargs, 2) < 0)
        return NULL;
    s0_bytes ticket;
    if (arg_bytes(args[1], "release", "ticket", &ticket) < 0)
        return NULL;
    int error;
    s0_worker *w = arg_worker(self, args[0], "release", 0, &error);
    if (error)
        return NULL;
    return PyBool_FromLong(w != NULL && pool_release(w, &ticket));
}

static PyObject *Pool_list_ready(PoolObject *self, PyObject *arg) {
    if (unguarded(self) < 0)
        return NULL;
    int error;
    s0_worker *w = arg_worker(self, arg, "list_ready", 0, &error);
    if (error)
        return NULL;
    if (w != NULL)
        pool_list_ready(w);
    Py_RETURN_NONE;
}

static PyObject *Pool_tickets(PoolObject *self, PyObject *arg) {
    if (unguarded(self) < 0)
        return NULL;
    s0_bytes rid;
    int gone;
    if (arg_bytes(arg, "tickets", "routing_id", &rid) < 0)
        return NULL;
    PyObject *tickets = sorted_tickets(self, &rid, &gone);
    if (gone)
        PyErr_Format(PyExc_KeyError, "Pool.tickets: no worker %R", arg);
    return tickets;
}

static PyObject *Pool_spare(PoolObject *self, PyObject *arg) {
    if (unguarded(self) < 0)
        return NULL;
    int error;
    s0_worker *w = arg_worker(self, arg, "spare", 1, &error);
    if (error)
        return NULL;
    return PyLong_FromLongLong(worker_spare(w));
}

static PyObject *Pool_used(PoolObject *self, PyObject *arg) {
    if (unguarded(self) < 0)
        return NULL;
    int error;
    s0_worker *w = arg_worker(self, arg, "used", 0, &error);
    if (error)
        return NULL;
    return PyLong_FromSize_t(w != NULL ? w->tickets.used : 0);
}

static PyObject *Pool_worker_count(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
    if (unguarded(self) < 0)
        return NULL;
    return PyLong_FromSize_t(self->pool.workers.used);
}

static PyObject *Pool_ids_of(PoolObject *self, PyObject *arg) {
    if (unguarded(self) < 0)
        return NULL;
    int error;
    s0_worker *w = arg_worker(self, arg, "ids_of", 0, &error);
    if (error)
        return NULL;
    return PyBool_FromLong(w != NULL && w->ids);
}

static PyMethodDef Pool_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Pool_add, METH_FASTCALL | METH_KEYWORDS,
     "add(routing_id, services, capacity, ids=False) -> bool: register a worker, or replace a "
     "known one keeping its tickets (True); ids: its READY asked for request_ids"},
    {"remove", (PyCFunction)Pool_remove, METH_O,
     "remove(routing_id) -> list[bytes] | None: the tickets the worker held, None if unknown"},
    {"offers", (PyCFunction)Pool_offers, METH_O, "offers(service) -> bool"},
    {"offered_count", (PyCFunction)Pool_offered_count, METH_O,
     "offered_count(service) -> int: workers offering it, ready or busy"},
    {"services", (PyCFunction)Pool_services, METH_NOARGS, "services() -> list[str], sorted"},
    {"ready_count", (PyCFunction)Pool_ready_count, METH_O,
     "ready_count(service) -> int: workers with a free slot for it"},
    {"queue", (PyCFunction)Pool_queue, METH_O,
     "queue(service) -> list[bytes]: its ready workers, least recently used first"},
    {"take", (PyCFunction)Pool_take, METH_O,
     "take(service) -> bytes | None: the least recently used worker with room, marked used"},
    {"hold", (PyCFunction)(void (*)(void))Pool_hold, METH_FASTCALL,
     "hold(routing_id, ticket): the worker runs ticket"},
    {"release", (PyCFunction)(void (*)(void))Pool_release, METH_FASTCALL,
     "release(routing_id, ticket) -> bool: it no longer does; False if it did not"},
    {"list_ready", (PyCFunction)Pool_list_ready, METH_O,
     "list_ready(routing_id): to the back of its services' queues if it has a free slot, out "
     "of them if it is full"},
    {"tickets", (PyCFunction)Pool_tickets, METH_O, "tickets(routing_id) -> list[bytes], sorted"},
    {"spare", (PyCFunction)Pool_spare, METH_O, "spare(routing_id) -> int: capacity - tickets"},
    {"used", (PyCFunction)Pool_used, METH_O,
     "used(routing_id) -> int: tickets held, 0 if the worker is unknown"},
    {"worker_count", (PyCFunction)Pool_worker_count, METH_NOARGS, "worker_count() -> int"},
    {"ids_of", (PyCFunction)Pool_ids_of, METH_O,
     "ids_of(routing_id) -> bool: its READY asked for request_ids (False if unknown)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "scale0.core._pool.Pool",
    .tp_basicsize = sizeof(PoolObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The worker pool in C: workers, their services, capacity and tickets; per service "
              "the workers with a free slot, least recently used first (scale0.core.workers)",
    .tp_new = Pool_new,
    .tp_dealloc = (destructor)Pool_dealloc,
    .tp_methods = Pool_methods,
};

/* ---- the C API, for the lane (_pool_api.h) ------------------------------------------------ */

static s0_bytes c_bytes(const void *data, size_t len) {
    s0_bytes b = {(const unsigned char *)data, len, hash_bytes((const unsigned char *)data, len)};
    return b;
}

static struct s0_pool *capi_pool_of(void *obj) {
    PyObject *o = (PyObject *)obj;
    return PyObject_TypeCheck(o, &PoolType) ? &((PoolObject *)o)->pool : NULL;
}

static const unsigned char *capi_peek(struct s0_pool *p, const void *service, size_t len,
                                      size_t *rid_len) {
    s0_bytes name = c_bytes(service, len);
    s0_service *s = pool_service(p, &name);
    if (s == NULL || s->head == NULL)
        return NULL;
    *rid_len = s->head->worker->key.len;
    return s->head->worker->key.data;
}

static const unsigned char *capi_take(struct s0_pool *p, const void *service, size_t len,
                                      size_t *rid_len) {
    s0_bytes name = c_bytes(service, len);
    s0_worker *w = pool_take(p, &name);
    if (w == NULL)
        return NULL;
    *rid_len = w->key.len;
    return w->key.data;
}

static int capi_hold(struct s0_pool *p, const void *rid, size_t rid_len, const void *ticket,
                     size_t ticket_len) {
    s0_bytes r = c_bytes(rid, rid_len), t = c_bytes(ticket, ticket_len);
    s0_worker *w = pool_worker(p, &r);
    if (w == NULL)
        return -2;
    return pool_hold(w, &t);
}

static int capi_release(struct s0_pool *p, const void *rid, size_t rid_len, const void *ticket,
                        size_t ticket_len) {
    s0_bytes r = c_bytes(rid, rid_len), t = c_bytes(ticket, ticket_len);
    s0_worker *w = pool_worker(p, &r);
    return w != NULL && pool_release(w, &t);
}

static void capi_list_ready(struct s0_pool *p, const void *rid, size_t rid_len) {
    s0_bytes r = c_bytes(rid, rid_len);
    s0_worker *w = pool_worker(p, &r);
    if (w != NULL)
        pool_list_ready(w);
}

static long long capi_used(struct s0_pool *p, const void *rid, size_t rid_len) {
    s0_bytes r = c_bytes(rid, rid_len);
    s0_worker *w = pool_worker(p, &r);
    return w != NULL ? (long long)w->tickets.used : 0;
}

static void capi_set_guard(struct s0_pool *p, const int *guard) {
    p->guard = guard;
}

static long long capi_offered(struct s0_pool *p, const void *service, size_t len) {
    s0_bytes name = c_bytes(service, len);
    s0_service *s = pool_service(p, &name);
    return s != NULL ? (long long)s->offered : 0;
}

static size_t capi_services_of(struct s0_pool *p, const void *rid, size_t rid_len,
                               const unsigned char **names, size_t *lens, size_t cap) {
    s0_bytes r = c_bytes(rid, rid_len);
    s0_worker *w = pool_worker(p, &r);
    if (w == NULL)
        return 0;
    for (size_t i = 0; i < w->n_links && i < cap; i++) {
        names[i] = w->links[i].service->key.data;
        lens[i] = w->links[i].service->key.len;
    }
    return w->n_links;
}

static int capi_ids_of(struct s0_pool *p, const void *rid, size_t rid_len) {
    s0_bytes r = c_bytes(rid, rid_len);
    s0_worker *w = pool_worker(p, &r);
    return w != NULL && w->ids;
}

static long long capi_spare(struct s0_pool *p, const void *rid, size_t rid_len) {
    s0_bytes r = c_bytes(rid, rid_len);
    s0_worker *w = pool_worker(p, &r);
    return w != NULL ? worker_spare(w) : 0;
}

static s0_pool_api c_api = {
    S0_POOL_API_VERSION, capi_pool_of,   capi_peek,    capi_take,
    capi_hold,           capi_release,   capi_list_ready, capi_used,
    capi_set_guard,      capi_offered,   capi_services_of, capi_ids_of,
    capi_spare,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "scale0.core._pool",
    "The worker pool in C (see the header comment of scale0/core/_pool.c).",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__pool(void) {
    s0_hash_seed();
    if (PyType_Ready(&PoolType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&PoolType);
    if (PyModule_AddObject(m, "Pool", (PyObject *)&PoolType) < 0) {
        Py_DECREF(&PoolType);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(&c_api, S0_POOL_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObject(m, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
