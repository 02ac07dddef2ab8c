/*
 * What the C brokers of the benchmarks share (tools/mdp_lru.c, the strict-LRU floor, its
 * Python-loop host tools/mdp_lru_loop.c, and tools/idle_floor.c, the liveness floor): libzmq's
 * declarations, the clock, the stop signals and a bound ROUTER. Built by tools/mdp_brokers.py
 * (build_c_broker, build_c_loop_module) against the libzmq pyzmq loads. No zmq.h is needed:
 * when it is missing, the few declarations below stand in
 * (libzmq's stable 4.x ABI; zmq_msg_t is its documented 64-byte opaque struct).
 */
#ifndef SCALE0_C_BROKER_H
#define SCALE0_C_BROKER_H

#ifndef _POSIX_C_SOURCE /* Python.h (tools/mdp_lru_loop.c) defines it first */
#define _POSIX_C_SOURCE 200809L
#endif
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__has_include)
#if __has_include(<zmq.h>)
#include <zmq.h>
#define HAVE_ZMQ_H 1
#endif
#endif

#ifndef HAVE_ZMQ_H
typedef struct zmq_msg_t {
    unsigned char _[64] __attribute__((aligned(sizeof(void *))));
} zmq_msg_t;
typedef struct zmq_pollitem_t {
    void *socket;
    int fd;
    short events;
    short revents;
} zmq_pollitem_t;
typedef void(zmq_free_fn)(void *data, void *hint);
#define ZMQ_ROUTER 6
#define ZMQ_FD 14
#define ZMQ_EVENTS 15
#define ZMQ_LINGER 17
#define ZMQ_SNDHWM 23
#define ZMQ_RCVHWM 24
#define ZMQ_LAST_ENDPOINT 32
#define ZMQ_HEARTBEAT_IVL 75
#define ZMQ_HEARTBEAT_TIMEOUT 77
#define ZMQ_DONTWAIT 1
#define ZMQ_SNDMORE 2
#define ZMQ_POLLIN 1
void *zmq_ctx_new(void);
int zmq_ctx_term(void *context);
void *zmq_socket(void *context, int type);
int zmq_close(void *socket);
int zmq_setsockopt(void *socket, int option, const void *value, size_t len);
int zmq_getsockopt(void *socket, int option, void *value, size_t *len);
int zmq_bind(void *socket, const char *endpoint);
int zmq_send(void *socket, const void *buf, size_t len, int flags);
int zmq_msg_init(zmq_msg_t *msg);
int zmq_msg_init_data(zmq_msg_t *msg, void *data, size_t size, zmq_free_fn *ffn, void *hint);
int zmq_msg_send(zmq_msg_t *msg, void *socket, int flags);
int zmq_msg_recv(zmq_msg_t *msg, void *socket, int flags);
int zmq_msg_close(zmq_msg_t *msg);
int zmq_msg_move(zmq_msg_t *dest, zmq_msg_t *src);
void *zmq_msg_data(zmq_msg_t *msg);
size_t zmq_msg_size(const zmq_msg_t *msg);
int zmq_msg_more(const zmq_msg_t *msg);
int zmq_poll(zmq_pollitem_t *items, int nitems, long timeout);
int zmq_errno(void);
const char *zmq_strerror(int errnum);
#endif

/* A host that does not use one of these (tools/mdp_lru_loop.c uses only now_s) builds them
 * without a warning. */
#define C_BROKER_UNUSED __attribute__((unused))

static volatile sig_atomic_t stopping C_BROKER_UNUSED;

C_BROKER_UNUSED static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

C_BROKER_UNUSED static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

/* SIGTERM and SIGINT set `stopping`: the loop ends and prints its stats. */
C_BROKER_UNUSED static void catch_stop_signals(void) {
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_handler = on_signal;
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGINT, &action, NULL);
}

/* A ROUTER bound to `endpoint`, its last endpoint printed as "<name> <endpoint>" on stdout;
 * `program` names the broker in the error that ends it when the bind fails. `zmtp_ms` > 0:
 * libzmq's ZMTP heartbeats on every connection it accepts (ZMQ_HEARTBEAT_IVL, and a timeout
 * of three intervals), set before the bind: the listener copies the options it has then. */
C_BROKER_UNUSED static void *bound(void *context, const char *endpoint, const char *name,
                                   const char *program, int zmtp_ms) {
    void *socket = zmq_socket(context, ZMQ_ROUTER);
    int zero = 0, hwm = 100000, timeout = 3 * zmtp_ms;
    zmq_setsockopt(socket, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(socket, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(socket, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    if (zmtp_ms > 0 &&
        (zmq_setsockopt(socket, ZMQ_HEARTBEAT_IVL, &zmtp_ms, sizeof(zmtp_ms)) != 0 ||
         zmq_setsockopt(socket, ZMQ_HEARTBEAT_TIMEOUT, &timeout, sizeof(timeout)) != 0)) {
        fprintf(stderr, "%s: ZMTP heartbeats on %s: %s\n", program, name,
                zmq_strerror(zmq_errno()));
        exit(2);
    }
    if (zmq_bind(socket, endpoint) != 0) {
        fprintf(stderr, "%s: cannot bind %s %s: %s\n", program, name, endpoint,
                zmq_strerror(zmq_errno()));
        exit(2);
    }
    char last[256];
    size_t len = sizeof(last);
    zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, last, &len);
    printf("%s %s\n", name, last);
    return socket;
}

#endif
