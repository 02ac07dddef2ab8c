/*
 * The strict-LRU Majordomo routing of the floor, shared by its two hosts so they cannot drift:
 *   - tools/mdp_lru.c (`mdp-lru`, bench case `c-lru`): a C process waiting in zmq_poll;
 *   - tools/mdp_lru_loop.c (the CPython extension `_mdp_lru_loop`, bench case `c-lru-loop`):
 *     the same routing called by a Python event loop (Tornado's, or asyncio's) once per
 *     wake-up, to measure what a C lane inside a Python loop costs at the least; or run in a
 *     thread of its own beside that loop (`c-lru-thread`).
 * A host includes tools/c_broker.h (libzmq's declarations), then this file; it sets `frontend`,
 * `backend`, `heartbeat_s` and `liveness`, calls lru_wake() for every wake-up (or runs
 * lru_poll_loop(), which does), and at its end lru_stats_line() and lru_free().
 *
 * Guarantee, the one Scale0 gives capacity-1 workers:
 *   - a worker gets its next request only after it has replied (at most one request held);
 *   - ready workers are served first in, first out, per service;
 *   - forwarding moves libzmq messages (zmq_msg_t) from the socket they came in on to the one
 *     they leave on: no body is copied; constant frames point at static bytes;
 *   - every wake-up drains both sockets until EAGAIN (bounded by a budget per socket).
 *
 * Wire (docs/protocol.md §10, rfc.zeromq.org 7/MDP and 18/MDP), told apart per message:
 *   client  "MDPC01": [empty] MDPC01 service body...         reply: [empty] MDPC01 service body...
 *   client  "MDPC02" without the empty frame (RFC 18): MDPC02 0x01 service body...
 *           reply: MDPC02 0x02 PARTIAL / 0x03 FINAL, service, body...
 *   client  "MDPC02" with the empty frame and REQUEST 0x02 (majortomo 0.2.0's reading):
 *           reply: [empty] MDPC02 0x03 PARTIAL / 0x04 FINAL, body... (no service frame)
 *   worker  "MDPW01" [empty] first; "MDPW02" with or without the empty frame. Commands as the
 *           RFCs number them. A worker is answered in the framing it used.
 * A PARTIAL from an MDPW02 worker to an MDPC01 client is dropped (MDP/0.1 has none).
 *
 * Liveness: the broker sends HEARTBEAT to each worker it has sent nothing for an interval,
 * and forgets an idle worker silent for `liveness` intervals. A busy worker is not expired (it
 * is single-threaded by the RFC and holds a request). Requests for a service without a ready
 * worker wait in a FIFO (at most MAX_QUEUED in all, then dropped); they do not expire.
 * Unexpected commands (READY twice, REPLY while idle, anything before READY) get DISCONNECT.
 * Not here, as a floor needs none of it: mmi.* services, request expiry, error replies to
 * clients (a request for a service no worker serves waits), more than MAX_WORKERS workers.
 */
#ifndef SCALE0_MDP_LRU_H
#define SCALE0_MDP_LRU_H

#define MAX_FRAMES 64        /* longer messages are dropped */
#define MAX_ID 255           /* routing ids and service names */
#define MAX_WORKERS 4096
#define MAX_SERVICES 256
#define MAX_QUEUED 100000    /* requests waiting for a worker, all services */
#ifndef DRAIN_BUDGET        /* tests of the loop host build with -DDRAIN_BUDGET=1 */
#define DRAIN_BUDGET 10000   /* messages per socket per wake-up */
#endif
#define TABLE_SIZE 8192      /* worker hash table, a power of two, > 2 * MAX_WORKERS */

/* Client dialects, from how the request was framed; a reply goes back the same way. */
enum { C_MDP01 = 1, C_RFC18 = 2, C_MAJORTOMO = 3 };
/* Worker dialects. */
enum { W_MDP01 = 1, W_MDP02 = 2 };

static char EMPTY[1];
static char SIG_C01[] = "MDPC01", SIG_C02[] = "MDPC02", SIG_W01[] = "MDPW01", SIG_W02[] = "MDPW02";
static char CMD[8] = {0, 1, 2, 3, 4, 5, 6, 7};

typedef struct request {
    struct request *next;
    int dialect;
    int nframes;     /* frames[0] is the client's routing id, then the body */
    zmq_msg_t frames[];
} request_t;

typedef struct {
    char name[MAX_ID];
    size_t len;
    int ready_head, ready_tail; /* worker indices, -1: none */
    request_t *queue_head, *queue_tail;
} service_t;

typedef struct {
    int in_use;
    unsigned char id[MAX_ID];
    size_t id_len;
    int dialect;        /* W_MDP01 or W_MDP02 */
    int delimiter;      /* it sends, and is sent, an empty frame first */
    int service;
    int busy;
    int client_dialect; /* of the request it holds */
    int next_ready;
    int in_ready;
    double expires_at, heartbeat_at;
} worker_t;

static service_t services[MAX_SERVICES];
static int n_services;
static worker_t workers[MAX_WORKERS];
static int table[TABLE_SIZE]; /* worker index + 1; 0 empty; -1 deleted */
static int tombstones;
static int queued;
static double heartbeat_s = 2.5;
static int liveness = 3;
static void *frontend, *backend;
static unsigned long long st_requests, st_replies, st_wakeups, st_dropped, st_disconnects;

/* ---- workers: a hash table on the routing id ------------------------------------------------ */

static uint32_t hash_id(const unsigned char *id, size_t len) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) {
        h = (h ^ id[i]) * 16777619u;
    }
    return h;
}

static int find_worker(const unsigned char *id, size_t len) {
    uint32_t slot = hash_id(id, len) & (TABLE_SIZE - 1);
    for (int probes = 0; probes < TABLE_SIZE; probes++) {
        int entry = table[slot];
        if (entry == 0) {
            return -1;
        }
        if (entry > 0) {
            worker_t *w = &workers[entry - 1];
            if (w->id_len == len && memcmp(w->id, id, len) == 0) {
                return entry - 1;
            }
        }
        slot = (slot + 1) & (TABLE_SIZE - 1);
    }
    return -1;
}

static void rebuild_table(void) {
    memset(table, 0, sizeof(table));
    tombstones = 0;
    for (int i = 0; i < MAX_WORKERS; i++) {
        if (workers[i].in_use) {
            uint32_t slot = hash_id(workers[i].id, workers[i].id_len) & (TABLE_SIZE - 1);
            while (table[slot] != 0) {
                slot = (slot + 1) & (TABLE_SIZE - 1);
            }
            table[slot] = i + 1;
        }
    }
}

static int add_worker(const unsigned char *id, size_t len) {
    int index = -1;
    for (int i = 0; i < MAX_WORKERS; i++) {
        if (!workers[i].in_use) {
            index = i;
            break;
        }
    }
    if (index < 0 || len > MAX_ID) {
        return -1;
    }
    worker_t *w = &workers[index];
    memset(w, 0, sizeof(*w));
    w->in_use = 1;
    memcpy(w->id, id, len);
    w->id_len = len;
    w->next_ready = -1;
    uint32_t slot = hash_id(id, len) & (TABLE_SIZE - 1);
    while (table[slot] > 0) {
        slot = (slot + 1) & (TABLE_SIZE - 1);
    }
    if (table[slot] < 0) {
        tombstones--;
    }
    table[slot] = index + 1;
    return index;
}

static void unlink_ready(int index) {
    worker_t *w = &workers[index];
    if (!w->in_ready) {
        return;
    }
    service_t *s = &services[w->service];
    int prev = -1;
    for (int i = s->ready_head; i >= 0; prev = i, i = workers[i].next_ready) {
        if (i == index) {
            if (prev < 0) {
                s->ready_head = w->next_ready;
            } else {
                workers[prev].next_ready = w->next_ready;
            }
            if (s->ready_tail == index) {
                s->ready_tail = prev;
            }
            break;
        }
    }
    w->in_ready = 0;
    w->next_ready = -1;
}

static void remove_worker(int index) {
    worker_t *w = &workers[index];
    unlink_ready(index);
    uint32_t slot = hash_id(w->id, w->id_len) & (TABLE_SIZE - 1);
    for (int probes = 0; probes < TABLE_SIZE; probes++) {
        if (table[slot] == index + 1) {
            table[slot] = -1;
            tombstones++;
            break;
        }
        slot = (slot + 1) & (TABLE_SIZE - 1);
    }
    w->in_use = 0;
    if (tombstones > TABLE_SIZE / 4) {
        rebuild_table();
    }
}

static int find_service(const char *name, size_t len, int create) {
    for (int i = 0; i < n_services; i++) {
        if (services[i].len == len && memcmp(services[i].name, name, len) == 0) {
            return i;
        }
    }
    if (!create || n_services == MAX_SERVICES || len > MAX_ID) {
        return -1;
    }
    service_t *s = &services[n_services];
    memcpy(s->name, name, len);
    s->len = len;
    s->ready_head = s->ready_tail = -1;
    s->queue_head = s->queue_tail = NULL;
    return n_services++;
}

/* ---- sending ---------------------------------------------------------------------------------- */

/* Send a constant frame: the message points at static bytes, nothing is copied or freed. */
static void send_const(void *socket, void *data, size_t size, int more) {
    zmq_msg_t msg;
    zmq_msg_init_data(&msg, data, size, NULL, NULL);
    if (zmq_msg_send(&msg, socket, more ? ZMQ_SNDMORE : 0) < 0) {
        zmq_msg_close(&msg);
    }
}

/* Send a received frame on: libzmq takes the message over (zero copy). */
static void send_moved(void *socket, zmq_msg_t *msg, int more) {
    if (zmq_msg_send(msg, socket, more ? ZMQ_SNDMORE : 0) < 0) {
        zmq_msg_close(msg);
    }
}

static void send_header(void *id, size_t id_len, int dialect, int delimiter, int command,
                        int more) {
    send_const(backend, id, id_len, 1);
    if (delimiter) {
        send_const(backend, EMPTY, 0, 1);
    }
    send_const(backend, dialect == W_MDP01 ? SIG_W01 : SIG_W02, 6, 1);
    send_const(backend, &CMD[command], 1, more);
}

static void send_worker_header(worker_t *w, int command, int more) {
    send_header(w->id, w->id_len, w->dialect, w->delimiter, command, more);
}

static void send_disconnect(int index) {
    worker_t *w = &workers[index];
    send_worker_header(w, w->dialect == W_MDP01 ? 5 : 6, 0);
    st_disconnects++;
}

/* DISCONNECT to a sender that is not (or no longer) a registered worker. */
static void disconnect_stranger(zmq_msg_t *id, int dialect, int delimiter) {
    send_header(zmq_msg_data(id), zmq_msg_size(id), dialect, delimiter, dialect == W_MDP01 ? 5 : 6,
                0);
    st_disconnects++;
}

/* REQUEST to a ready worker: client routing id and body frames are moved, not copied. */
static void dispatch(int index, int client_dialect, zmq_msg_t *client_id, zmq_msg_t *body,
                     int n_body, double now) {
    worker_t *w = &workers[index];
    send_worker_header(w, 2, 1);
    send_moved(backend, client_id, 1);
    send_const(backend, EMPTY, 0, n_body > 0);
    for (int i = 0; i < n_body; i++) {
        send_moved(backend, &body[i], i + 1 < n_body);
    }
    w->busy = 1;
    w->client_dialect = client_dialect;
    w->heartbeat_at = now + heartbeat_s; /* any command counts as a heartbeat */
    st_requests++;
}

/* The worker is free: the oldest waiting request of its service, else the back of the queue. */
static void worker_ready(int index, double now) {
    worker_t *w = &workers[index];
    service_t *s = &services[w->service];
    w->busy = 0;
    request_t *r = s->queue_head;
    if (r != NULL) {
        s->queue_head = r->next;
        if (s->queue_head == NULL) {
            s->queue_tail = NULL;
        }
        queued--;
        dispatch(index, r->dialect, &r->frames[0], &r->frames[1], r->nframes - 1, now);
        free(r);
        return;
    }
    w->next_ready = -1;
    w->in_ready = 1;
    if (s->ready_tail < 0) {
        s->ready_head = index;
    } else {
        workers[s->ready_tail].next_ready = index;
    }
    s->ready_tail = index;
}

/* ---- the two sockets -------------------------------------------------------------------------- */

static int is_empty(zmq_msg_t *msg) { return zmq_msg_size(msg) == 0; }

static int equals(zmq_msg_t *msg, const char *text, size_t len) {
    return zmq_msg_size(msg) == len && memcmp(zmq_msg_data(msg), text, len) == 0;
}

static int command_of(zmq_msg_t *msg) {
    return zmq_msg_size(msg) == 1 ? ((unsigned char *)zmq_msg_data(msg))[0] : -1;
}

/* Frames f[0..n): f[0] the client's routing id. Returns 1 if the frames were taken over. */
static int on_client(zmq_msg_t *f, int n, double now) {
    int at = 1, dialect;
    if (n > 1 && is_empty(&f[1])) {
        at = 2;
    }
    if (n <= at + 1) {
        return 0;
    }
    if (at == 2 && equals(&f[at], SIG_C01, 6)) {
        dialect = C_MDP01;
        at += 1;
    } else if (equals(&f[at], SIG_C02, 6) && n > at + 2) {
        int command = command_of(&f[at + 1]);
        if (at == 1 && command == 1) {
            dialect = C_RFC18;
        } else if (at == 2 && (command == 2 || command == 1)) {
            dialect = C_MAJORTOMO;
        } else {
            return 0;
        }
        at += 2;
    } else {
        return 0;
    }
    if (at >= n) {
        return 0; /* no service frame */
    }
    int sindex = find_service(zmq_msg_data(&f[at]), zmq_msg_size(&f[at]), 1);
    if (sindex < 0) {
        return 0;
    }
    service_t *s = &services[sindex];
    int body_at = at + 1, n_body = n - body_at;
    if (s->ready_head >= 0) {
        int index = s->ready_head;
        s->ready_head = workers[index].next_ready;
        if (s->ready_head < 0) {
            s->ready_tail = -1;
        }
        workers[index].in_ready = 0;
        workers[index].next_ready = -1;
        dispatch(index, dialect, &f[0], &f[body_at], n_body, now);
        for (int i = 1; i < body_at; i++) {
            zmq_msg_close(&f[i]);
        }
        return 1;
    }
    if (queued >= MAX_QUEUED) {
        return 0;
    }
    request_t *r = malloc(sizeof(request_t) + sizeof(zmq_msg_t) * (size_t)(1 + n_body));
    if (r == NULL) {
        return 0;
    }
    r->next = NULL;
    r->dialect = dialect;
    r->nframes = 1 + n_body;
    zmq_msg_init(&r->frames[0]);
    zmq_msg_move(&r->frames[0], &f[0]);
    zmq_msg_close(&f[0]);
    for (int i = 0; i < n_body; i++) {
        zmq_msg_init(&r->frames[1 + i]);
        zmq_msg_move(&r->frames[1 + i], &f[body_at + i]);
        zmq_msg_close(&f[body_at + i]);
    }
    for (int i = 1; i < body_at; i++) {
        zmq_msg_close(&f[i]);
    }
    if (s->queue_tail) {
        s->queue_tail->next = r;
    } else {
        s->queue_head = r;
    }
    s->queue_tail = r;
    queued++;
    return 1;
}

/* Reply (or PARTIAL) to the client of the worker's request: routing id and body moved. */
static void to_client(worker_t *w, zmq_msg_t *client_id, zmq_msg_t *body, int n_body, int final) {
    service_t *s = &services[w->service];
    int cd = w->client_dialect;
    send_moved(frontend, client_id, 1);
    if (cd != C_RFC18) {
        send_const(frontend, EMPTY, 0, 1);
    }
    if (cd == C_MDP01) {
        send_const(frontend, SIG_C01, 6, 1);
        send_const(frontend, s->name, s->len, n_body > 0);
    } else if (cd == C_RFC18) {
        send_const(frontend, SIG_C02, 6, 1);
        send_const(frontend, &CMD[final ? 3 : 2], 1, 1);
        send_const(frontend, s->name, s->len, n_body > 0);
    } else {
        send_const(frontend, SIG_C02, 6, 1);
        send_const(frontend, &CMD[final ? 4 : 3], 1, n_body > 0);
    }
    for (int i = 0; i < n_body; i++) {
        send_moved(frontend, &body[i], i + 1 < n_body);
    }
}

/* Frames f[0..n): f[0] the worker's routing id. Returns 1 if the frames were taken over. */
static int on_worker(zmq_msg_t *f, int n, double now) {
    int at = 1, dialect;
    if (n > 1 && is_empty(&f[1])) {
        at = 2;
    }
    if (n < at + 2) {
        return 0;
    }
    if (at == 2 && equals(&f[at], SIG_W01, 6)) {
        dialect = W_MDP01;
    } else if (equals(&f[at], SIG_W02, 6)) {
        dialect = W_MDP02;
    } else {
        return 0;
    }
    int command = command_of(&f[at + 1]);
    int rest = at + 2; /* first frame after the command */
    /* Commands by the dialect's numbers, mapped to: 1 READY, 3 PARTIAL, 4 FINAL/REPLY,
     * 5 HEARTBEAT, 6 DISCONNECT, -1 anything else (REQUEST 2 is broker to worker only). */
    if (dialect == W_MDP01) {
        static const int map01[] = {-1, 1, -1, 4, 5, 6};
        command = (command >= 0 && command <= 5) ? map01[command] : -1;
    } else if (command == 2 || command > 6) {
        command = -1;
    }
    int index = find_worker(zmq_msg_data(&f[0]), zmq_msg_size(&f[0]));
    if (index >= 0) {
        worker_t *w = &workers[index];
        if (w->dialect != dialect || w->delimiter != (at == 2)) {
            command = -1; /* a worker keeps the framing it started with */
        }
        w->expires_at = now + heartbeat_s * liveness;
    }
    switch (command) {
    case 1: /* READY service */
        if (index >= 0) {
            send_disconnect(index); /* "MUST NOT send a further READY" */
            remove_worker(index);
            return 0;
        }
        if (n != rest + 1) {
            return 0;
        }
        index = add_worker(zmq_msg_data(&f[0]), zmq_msg_size(&f[0]));
        if (index < 0) {
            return 0;
        }
        int sindex = find_service(zmq_msg_data(&f[rest]), zmq_msg_size(&f[rest]), 1);
        if (sindex < 0) {
            remove_worker(index);
            return 0;
        }
        workers[index].dialect = dialect;
        workers[index].delimiter = at == 2;
        workers[index].service = sindex;
        workers[index].expires_at = now + heartbeat_s * liveness;
        workers[index].heartbeat_at = now + heartbeat_s;
        worker_ready(index, now);
        return 0;
    case 3: /* PARTIAL client empty body... */
    case 4: /* FINAL / REPLY client empty body... */
        if (index < 0) {
            disconnect_stranger(&f[0], dialect, at == 2);
            return 0;
        }
        if (!workers[index].busy) {
            send_disconnect(index);
            remove_worker(index);
            return 0;
        }
        if (n < rest + 2 || !is_empty(&f[rest + 1])) {
            send_disconnect(index); /* invalid: forget the worker, its request is lost */
            remove_worker(index);
            return 0;
        }
        if (command == 3 && workers[index].client_dialect == C_MDP01) {
            return 0; /* MDP/0.1 clients have no PARTIAL */
        }
        to_client(&workers[index], &f[rest], &f[rest + 2], n - rest - 2, command == 4);
        for (int i = 1; i < rest; i++) {
            zmq_msg_close(&f[i]);
        }
        zmq_msg_close(&f[rest + 1]);
        zmq_msg_close(&f[0]);
        if (command == 4) {
            st_replies++;
            worker_ready(index, now);
        }
        return 1;
    case 5: /* HEARTBEAT */
        if (index < 0) {
            disconnect_stranger(&f[0], dialect, at == 2); /* unknown or forgotten: start over */
        }
        return 0;
    case 6: /* DISCONNECT: send it nothing more */
        if (index >= 0) {
            remove_worker(index);
        }
        return 0;
    default:
        if (index >= 0) {
            send_disconnect(index);
            remove_worker(index);
        } else {
            disconnect_stranger(&f[0], dialect, at == 2);
        }
        return 0;
    }
}

/* Receive and handle every message waiting on `socket` (up to the budget). */
static void drain(void *socket, int is_frontend, double now) {
    static zmq_msg_t f[MAX_FRAMES];
    for (int handled = 0; handled < DRAIN_BUDGET; handled++) {
        int n = 0, more = 1, too_long = 0;
        while (more) {
            zmq_msg_t scratch, *msg = n < MAX_FRAMES ? &f[n] : &scratch;
            zmq_msg_init(msg);
            if (zmq_msg_recv(msg, socket, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                int err = zmq_errno();
                zmq_msg_close(msg);
                if (err == EINTR && n > 0) {
                    continue; /* mid-message: the rest is already queued */
                }
                for (int i = 0; i < n && i < MAX_FRAMES; i++) {
                    zmq_msg_close(&f[i]);
                }
                return; /* EAGAIN: drained */
            }
            more = zmq_msg_more(msg);
            if (n < MAX_FRAMES) {
                n++;
            } else {
                too_long = 1;
                zmq_msg_close(msg);
            }
        }
        int taken = 0;
        if (!too_long) {
            taken = is_frontend ? on_client(f, n, now) : on_worker(f, n, now);
        }
        if (!taken) {
            st_dropped += (unsigned long long)(is_frontend || too_long);
            for (int i = 0; i < n; i++) {
                zmq_msg_close(&f[i]);
            }
        }
    }
}

static void heartbeat_tick(double now) {
    for (int i = 0; i < MAX_WORKERS; i++) {
        worker_t *w = &workers[i];
        if (!w->in_use) {
            continue;
        }
        if (!w->busy && now >= w->expires_at) {
            remove_worker(i); /* silent for `liveness` intervals: send it nothing more */
            continue;
        }
        if (now >= w->heartbeat_at) {
            send_worker_header(w, w->dialect == W_MDP01 ? 4 : 5, 0);
            w->heartbeat_at = now + heartbeat_s;
        }
    }
}

static double next_tick;

/* One wake-up: replies first (each frees a worker for the requests drained next), then
 * requests; the heartbeat round when it is due, or when `force_tick` says the host's timer
 * fired. A round is idempotent (per worker, heartbeat_at and expires_at decide). */
static void lru_wake(double now, int force_tick) {
    st_wakeups++;
    drain(backend, 0, now);
    drain(frontend, 1, now);
    if (force_tick || now >= next_tick) {
        heartbeat_tick(now);
        next_tick = now + heartbeat_s;
    }
}

/* The zmq_poll loop of a C host: wait for either socket or the next heartbeat round, wake, until
 * `*stop` is set. `max_wait_ms` >= 0 bounds each wait (a host whose `stop` is set by another
 * thread, without a signal to interrupt zmq_poll); -1: the heartbeat round alone bounds it.
 * `program` names the host in the error that ends the loop. */
static void lru_poll_loop(volatile sig_atomic_t *stop, long max_wait_ms, const char *program) {
    zmq_pollitem_t items[2] = {{frontend, 0, ZMQ_POLLIN, 0}, {backend, 0, ZMQ_POLLIN, 0}};
    next_tick = now_s() + heartbeat_s;
    while (!*stop) {
        double now = now_s();
        long timeout_ms = (long)((next_tick - now) * 1000.0) + 1;
        if (timeout_ms < 0) {
            timeout_ms = 0;
        }
        if (max_wait_ms >= 0 && timeout_ms > max_wait_ms) {
            timeout_ms = max_wait_ms;
        }
        int rc = zmq_poll(items, 2, timeout_ms);
        if (rc < 0) {
            if (zmq_errno() == EINTR) {
                continue;
            }
            fprintf(stderr, "%s: zmq_poll: %s\n", program, zmq_strerror(zmq_errno()));
            break;
        }
        lru_wake(now_s(), 0);
    }
}

/* The counters, as the hosts print them on stop: "stats requests=... queued=...". */
static int lru_stats_line(char *out, size_t size) {
    return snprintf(out, size,
                    "stats requests=%llu replies=%llu wakeups=%llu dropped=%llu disconnects=%llu "
                    "queued=%d",
                    st_requests, st_replies, st_wakeups, st_dropped, st_disconnects, queued);
}

/* Free the requests still waiting (their frames are libzmq messages). */
static void lru_free(void) {
    for (int i = 0; i < n_services; i++) {
        for (request_t *r = services[i].queue_head, *next; r != NULL; r = next) {
            next = r->next;
            for (int j = 0; j < r->nframes; j++) {
                zmq_msg_close(&r->frames[j]);
            }
            free(r);
        }
        services[i].queue_head = services[i].queue_tail = NULL;
    }
    queued = 0;
}

#endif
