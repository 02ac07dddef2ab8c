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
    frontend = bound(context, argv[arg], "frontend", "mdp-lru", 0);
    backend = bound(context, argv[arg + 1], "backend", "mdp-lru", 0);
    fflush(stdout);

    lru_poll_loop(&stopping, -1, "mdp-lru");
    char line[256];
    lru_stats_line(line, sizeof(line));
    fprintf(stderr, "%s\n", line);
    lru_free();
    zmq_close(frontend);
    zmq_close(backend);
    zmq_ctx_term(context);
    return 0;
}
