/*
 * idle-floor: the least a broker on raw libzmq can do for idle S0P clients and workers, the
 * floor `tools/bench idle --cases c-idle` measures Scale0's liveness against
 * (docs/performance.md, "The liveness floor").
 *
 * It does, at the same message rate as Scale0, what the idle bench's drivers need and what
 * liveness costs, and nothing else:
 *   - CHECKCONFIG (client or worker) is answered with a canned CONFIG {"config_version":0};
 *   - READY registers a worker: it is sent a HEARTBEAT every interval from then on (beaten in
 *     ten rounds per interval, by the tenth of it the READY came in, as Scale0 does);
 *   - a client's HEARTBEAT is answered with a HEARTBEAT at once (docs/protocol.md §3.4);
 *   - every peer's last message is noted; a peer silent for `liveness` intervals is forgotten
 *     (no more beats), and a HEARTBEAT from a peer it does not know gets FORCENEGOTIATE;
 *   - every wake-up drains both sockets until EAGAIN (bounded by a budget per socket); the
 *     HEARTBEAT body {"time":<wall clock>,"config_version":0} is formatted once per wake-up.
 * Anything else (other commands, malformed messages) is read and dropped.
 *
 * With -s (silent) it sends nothing after CONFIG: no answer to a client's HEARTBEAT, no beat to
 * a worker. That is not the protocol (workers and clients would count the broker dead); it is
 * what reading the HEARTBEATs alone costs, the least any liveness over libzmq can cost when
 * every peer speaks once per interval.
 *
 * With -p promise_ms (idle beating, docs/protocol.md §3.4) its HEARTBEATs also say
 * "interval_ms":promise_ms: run with -i and -p both the idle interval, it is the floor of the
 * idle protocol, where every idle peer and the broker beat (and are forgotten) at that interval.
 *
 * With -z zmtp_ms both sockets also set libzmq's own ZMTP heartbeats (ZMQ_HEARTBEAT_IVL
 * zmtp_ms, ZMQ_HEARTBEAT_TIMEOUT 3 x zmtp_ms): libzmq's I/O thread PINGs every connection and
 * drops one that answers nothing, with no message reaching the program. Run with -s 1 and a
 * liveness of its own too long to matter, and peers that stay silent, it is what liveness by
 * ZMTP heartbeats alone costs a broker (`tools/bench idle --cases c-zmtp`).
 *
 * Usage: idle-floor [-i heartbeat_ms] [-l liveness] [-s 1] [-p promise_ms] [-z zmtp_ms]
 *                   FRONTEND BACKEND
 *   binds both (tcp://127.0.0.1:* picks a port), prints "frontend <endpoint>" and
 *   "backend <endpoint>" on stdout, and on SIGTERM/SIGINT prints one "stats ..." line on
 *   stderr and exits 0.
 *
 * Built by tools/mdp_brokers.py (build_c_broker) against the libzmq pyzmq loads, like
 * tools/mdp_lru.c; what the two share (libzmq's declarations without zmq.h, the clock, the stop
 * signals, a bound ROUTER) is tools/c_broker.h.
 */
#include "c_broker.h"

#define MAX_ID 255          /* routing ids */
#define MAX_SIG 16          /* signature frames ("S0C1", "S0W1") */
#define MAX_PEERS 32768     /* peers ever seen, both sockets; more are not tracked */
#define TABLE_SIZE 65536    /* a power of two, > 2 * MAX_PEERS; entries are never removed */
#define DRAIN_BUDGET 10000  /* messages per socket per wake-up */
#define ROUNDS 10           /* worker beat rounds per interval */

typedef struct {
    unsigned char id[MAX_ID];
    size_t id_len;
    int backend;    /* a worker's connection (1) or a client's (0) */
    int live;       /* negotiated and not yet forgotten */
    int beating;    /* a worker that said READY: beaten every interval */
    double last_seen, beat_at;
} peer_t;

static peer_t peers[MAX_PEERS];
static int n_peers;
static int table[TABLE_SIZE]; /* peer index + 1; 0 empty */
static double heartbeat_s = 1.0;
static int liveness = 3;
static int silent;
static int promise_ms; /* 0: HEARTBEATs carry no interval_ms */
static int zmtp_ms;    /* 0: no ZMTP heartbeats */
static void *frontend, *backend;
static unsigned long long st_received, st_sent, st_wakeups, st_ticks, st_forgotten, st_forced,
    st_dropped, st_untracked;
static char beat_body[96];
static size_t beat_len;
static const char CONFIG_BODY[] = "{\"config_version\":0}";

static uint32_t hash_id(const unsigned char *id, size_t len, int is_backend) {
    uint32_t h = 2166136261u ^ (uint32_t)is_backend;
    for (size_t i = 0; i < len; i++) {
        h = (h ^ id[i]) * 16777619u;
    }
    return h;
}

/* The peer with this routing id on this socket; created (not live) when `create`; NULL when
 * unknown and not created, or when the table is full. */
static peer_t *find_peer(const unsigned char *id, size_t len, int is_backend, int create) {
    uint32_t slot = hash_id(id, len, is_backend) & (TABLE_SIZE - 1);
    for (;;) {
        int entry = table[slot];
        if (entry == 0) {
            break;
        }
        peer_t *p = &peers[entry - 1];
        if (p->backend == is_backend && p->id_len == len && memcmp(p->id, id, len) == 0) {
            return p;
        }
        slot = (slot + 1) & (TABLE_SIZE - 1);
    }
    if (!create) {
        return NULL;
    }
    if (n_peers == MAX_PEERS) {
        st_untracked++;
        return NULL;
    }
    peer_t *p = &peers[n_peers];
    memset(p, 0, sizeof(*p));
    memcpy(p->id, id, len);
    p->id_len = len;
    p->backend = is_backend;
    table[slot] = ++n_peers;
    return p;
}

/* [id, "", sig, command, body]: one message out; a full pipe drops it (counted). */
static void send_to(void *socket, const unsigned char *id, size_t id_len, const char *sig,
                    size_t sig_len, const char *command, const char *body, size_t body_len) {
    if (zmq_send(socket, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        st_dropped++;
        return;
    }
    zmq_send(socket, "", 0, ZMQ_SNDMORE);
    zmq_send(socket, sig, sig_len, ZMQ_SNDMORE);
    zmq_send(socket, command, strlen(command), ZMQ_SNDMORE);
    zmq_send(socket, body, body_len, 0);
    st_sent++;
}

/* One message from `socket`: 0 when it had none. */
static int handle_one(void *socket, int is_backend, double now) {
    unsigned char id[MAX_ID];
    char sig[MAX_SIG], command[32];
    size_t id_len = 0, sig_len = 0, command_len = 0;
    int nframes = 0, ok = 1, more = 1;
    while (more) {
        zmq_msg_t frame;
        zmq_msg_init(&frame);
        if (zmq_msg_recv(&frame, socket, nframes == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(&frame);
            return 0; /* EAGAIN before a message: none; never mid-message (atomic delivery) */
        }
        size_t size = zmq_msg_size(&frame);
        const void *data = zmq_msg_data(&frame);
        if (nframes == 0) {
            ok = size <= MAX_ID;
            if (ok) {
                memcpy(id, data, size);
                id_len = size;
            }
        } else if (nframes == 1) {
            ok = ok && size == 0;
        } else if (nframes == 2) {
            ok = ok && size <= MAX_SIG;
            if (ok) {
                memcpy(sig, data, size);
                sig_len = size;
            }
        } else if (nframes == 3) {
            ok = ok && size < sizeof(command);
            if (ok) {
                memcpy(command, data, size);
                command_len = size;
            }
        }
        more = zmq_msg_more(&frame);
        zmq_msg_close(&frame);
        nframes++;
    }
    st_received++;
    if (!ok || nframes < 4) {
        return 1;
    }
    command[command_len] = '\0';
    if (strcmp(command, "HEARTBEAT") == 0) {
        peer_t *p = find_peer(id, id_len, is_backend, 0);
        if (p == NULL || !p->live) {
            send_to(socket, id, id_len, sig, sig_len, "FORCENEGOTIATE", "{}", 2);
            st_forced++;
            return 1;
        }
        p->last_seen = now;
        if (!is_backend && !silent) {
            send_to(socket, id, id_len, sig, sig_len, "HEARTBEAT", beat_body, beat_len);
        }
    } else if (strcmp(command, "CHECKCONFIG") == 0) {
        peer_t *p = find_peer(id, id_len, is_backend, 1);
        if (p != NULL) {
            p->live = 1;
            p->last_seen = now;
        }
        send_to(socket, id, id_len, sig, sig_len, "CONFIG", CONFIG_BODY, sizeof(CONFIG_BODY) - 1);
    } else if (strcmp(command, "READY") == 0 && is_backend) {
        peer_t *p = find_peer(id, id_len, 1, 0);
        if (p != NULL && p->live) {
            p->last_seen = now;
            if (!p->beating && !silent) {
                /* First beat one interval after the round this READY came in. */
                double round = heartbeat_s / ROUNDS;
                p->beating = 1;
                p->beat_at = ((long long)(now / round) + 1) * round + heartbeat_s - round;
            }
        }
    }
    return 1;
}

static void drain(void *socket, int is_backend, double now) {
    for (int i = 0; i < DRAIN_BUDGET && handle_one(socket, is_backend, now); i++) {
    }
}

static void format_beat(void) {
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    double time = (double)wall.tv_sec + (double)wall.tv_nsec / 1e9;
    int n = promise_ms > 0 ? snprintf(beat_body, sizeof(beat_body),
                                      "{\"time\":%.6f,\"config_version\":0,\"interval_ms\":%d}",
                                      time, promise_ms)
                           : snprintf(beat_body, sizeof(beat_body),
                                      "{\"time\":%.6f,\"config_version\":0}", time);
    beat_len = n > 0 ? (size_t)n : 0;
}

/* A round: beat the workers that are due; forget the peers silent past liveness. */
static void tick(double now) {
    st_ticks++;
    double timeout = heartbeat_s * liveness;
    for (int i = 0; i < n_peers; i++) {
        peer_t *p = &peers[i];
        if (!p->live) {
            continue;
        }
        if (now - p->last_seen > timeout) {
            p->live = 0;
            p->beating = 0;
            st_forgotten++;
            continue;
        }
        if (p->beating && now >= p->beat_at) {
            send_to(backend, p->id, p->id_len, "S0B1", 4, "HEARTBEAT", beat_body, beat_len);
            p->beat_at += heartbeat_s;
            if (p->beat_at <= now) { /* a stalled process: no burst of catch-up beats */
                p->beat_at = now + heartbeat_s;
            }
        }
    }
}

int main(int argc, char **argv) {
    int arg = 1;
    while (arg + 1 < argc && argv[arg][0] == '-') {
        if (strcmp(argv[arg], "-i") == 0) {
            heartbeat_s = atof(argv[arg + 1]) / 1000.0;
        } else if (strcmp(argv[arg], "-l") == 0) {
            liveness = atoi(argv[arg + 1]);
        } else if (strcmp(argv[arg], "-s") == 0) {
            silent = atoi(argv[arg + 1]);
        } else if (strcmp(argv[arg], "-p") == 0) {
            promise_ms = atoi(argv[arg + 1]);
        } else if (strcmp(argv[arg], "-z") == 0) {
            zmtp_ms = atoi(argv[arg + 1]);
        } else {
            break;
        }
        arg += 2;
    }
    if (argc - arg != 2 || heartbeat_s <= 0 || liveness < 1 || zmtp_ms < 0) {
        fprintf(stderr, "usage: idle-floor [-i heartbeat_ms] [-l liveness] [-s 1] [-p promise_ms] "
                        "[-z zmtp_ms] FRONTEND BACKEND\n");
        return 2;
    }
    catch_stop_signals();

    void *context = zmq_ctx_new();
    frontend = bound(context, argv[arg], "frontend", "idle-floor", zmtp_ms);
    backend = bound(context, argv[arg + 1], "backend", "idle-floor", zmtp_ms);
    fflush(stdout);

    zmq_pollitem_t items[2] = {{frontend, 0, ZMQ_POLLIN, 0}, {backend, 0, ZMQ_POLLIN, 0}};
    double round = heartbeat_s / ROUNDS;
    double next_tick = now_s() + round;
    while (!stopping) {
        double now = now_s();
        long timeout_ms = (long)((next_tick - now) * 1000.0) + 1;
        if (timeout_ms < 0) {
            timeout_ms = 0;
        }
        int rc = zmq_poll(items, 2, timeout_ms);
        if (rc < 0) {
            if (zmq_errno() == EINTR) {
                continue;
            }
            fprintf(stderr, "idle-floor: zmq_poll: %s\n", zmq_strerror(zmq_errno()));
            break;
        }
        st_wakeups++;
        now = now_s();
        format_beat();
        drain(backend, 1, now);
        drain(frontend, 0, now);
        if (now >= next_tick) {
            tick(now);
            next_tick += round;
            if (next_tick <= now) {
                next_tick = now + round;
            }
        }
    }
    int live = 0;
    for (int i = 0; i < n_peers; i++) {
        live += peers[i].live;
    }
    fprintf(stderr,
            "stats received=%llu sent=%llu wakeups=%llu ticks=%llu forgotten=%llu forced=%llu "
            "dropped=%llu untracked=%llu peers=%d live=%d\n",
            st_received, st_sent, st_wakeups, st_ticks, st_forgotten, st_forced, st_dropped,
            st_untracked, n_peers, live);
    zmq_close(frontend);
    zmq_close(backend);
    zmq_ctx_term(context);
    return 0;
}
