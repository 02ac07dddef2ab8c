/*
 * mdp-lru: a minimal strict-LRU Majordomo broker on raw libzmq, the floor tools/bench measures
 * every broker against (docs/performance.md, "Majordomo floor").
 *
 * Usage: mdp-lru [-i heartbeat_ms] [-l liveness] FRONTEND BACKEND
 *   binds both (tcp://127.0.0.1:* picks a port), prints "frontend <endpoint>" and
 *   "backend <endpoint>" on stdout, and on SIGTERM/SIGINT prints one "stats ..." line on
 *   stderr and exits 0.
 *
 * The routing (guarantee, wire, liveness) is tools/mdp_lru.h, shared with tools/mdp_lru_loop.c.
 *
 * Built by tools/mdp_brokers.py against the libzmq pyzmq loads; no zmq.h is needed
 * (tools/c_broker.h, shared with tools/idle_floor.c, declares what it uses).
 */
#include "c_broker.h"
#include "mdp_lru.h"

int main(int argc, char **argv) {
    int arg = 1;
    while (arg + 1 < argc && argv[arg][0] == '-') {
        if (strcmp(argv[arg], "-i") == 0) {
            heartbeat_s = atof(argv[arg + 1]) / 1000.0;
        } else if (strcmp(argv[arg], "-l") == 0) {
            liveness = atoi(argv[arg + 1]);
        } else {
            break;
        }
        arg += 2;
    }
    if (argc - arg != 2 || heartbeat_s <= 0 || liveness < 1) {
        fprintf(stderr, "usage: mdp-lru [-i heartbeat_ms] [-l liveness] FRONTEND BACKEND\n");
        return 2;
    }
    catch_stop_signals();

    void *context = zmq_ctx_new();
    frontend = bound(context, argv[arg], "frontend", "mdp-lru");
    backend = bound(context, argv[arg + 1], "backend", "mdp-lru");
    fflush(stdout);

    zmq_pollitem_t items[2] = {{frontend, 0, ZMQ_POLLIN, 0}, {backend, 0, ZMQ_POLLIN, 0}};
    next_tick = now_s() + heartbeat_s;
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
            fprintf(stderr, "mdp-lru: zmq_poll: %s\n", zmq_strerror(zmq_errno()));
            break;
        }
        lru_wake(now_s(), 0);
    }
    char line[256];
    lru_stats_line(line, sizeof(line));
    fprintf(stderr, "%s\n", line);
    lru_free();
    zmq_close(frontend);
    zmq_close(backend);
    zmq_ctx_term(context);
    return 0;
}
