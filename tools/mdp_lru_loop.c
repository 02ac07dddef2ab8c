/*
 * _mdp_lru_loop: the strict-LRU floor's routing (tools/mdp_lru.h, the very code of
 * tools/mdp_lru.c) as a CPython extension, called by a Python event loop: the least a C lane
 * inside Scale0's Tornado loop can cost (bench case `c-lru-loop`; `c-lru-asyncio` without
 * Tornado; docs/performance.md, "The floor of a C lane inside a Python loop").
 *
 * The host (tools/mdp_lru_loop.py) binds two ROUTERs with pyzmq, hands their libzmq handles
 * (`Socket.underlying`) to start(), and registers wake() itself as the loop's reader callback
 * for both sockets' ZMQ_FDs, and tick() on a timer every heartbeat interval. One wake-up is one
 * call into C that does everything mdp_lru.c does per zmq_poll return: drain the backend, then
 * the frontend, route, send, and the heartbeat round when due. No Python runs per message.
 *
 *   start(frontend, backend, heartbeat_ms, liveness, again)  handles as ints; `again` a
 *       callable (no arguments) called when a wake-up stops with input still pending
 *   wake(*ignored)   one wake-up (Tornado passes fd and events, asyncio nothing)
 *   tick(*ignored)   one wake-up with the heartbeat round forced (the host's timer)
 *   run_thread()     instead of wake/tick: the lane in a thread of its own, waiting in zmq_poll
 *                    as mdp_lru.c does (lru_poll_loop), without the GIL; the Python loop
 *                    beside it is only the control plane (bench case `c-lru-thread`)
 *   stop_thread()    stop that thread (within LANE_MAX_WAIT_MS) and wait for it
 *   stats()          "stats requests=... queued=..." as mdp-lru prints it, then "again=N":
 *                    the wake-ups that ended on MAX_ROUNDS with input left
 *   close()          free the requests still waiting; start() may be called again
 *
 * ZMQ_FD signals edges: a send made while draining one socket may process the other's
 * commands and take the edge of input that came meanwhile. So a wake-up ends only when
 * ZMQ_EVENTS shows no input on either socket (zmq_poll asks the same of libzmq in mdp_lru.c),
 * or after MAX_ROUNDS drains, when it asks the loop (`again`) for another.
 *
 * Built by tools/mdp_brokers.py (build_c_loop_module) with gcc against Python's headers and the
 * libzmq pyzmq loads (the handles must be that libzmq's); no zmq.h is needed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>

#include "c_broker.h"
#include "mdp_lru.h"

#ifndef MAX_ROUNDS /* tests build with -DMAX_ROUNDS=0 -DDRAIN_BUDGET=1: the `again` path */
#define MAX_ROUNDS 64 /* drains of both sockets per wake-up, after the first */
#endif

static int started;
static unsigned long long st_again;
static pthread_t lane;
static int lane_running;
static volatile sig_atomic_t lane_stop;
#define LANE_MAX_WAIT_MS 100 /* how soon the lane thread sees stop_thread() */
static PyObject *again_callback;

static int has_input(void *socket) {
    int events = 0;
    size_t len = sizeof(events);
    if (zmq_getsockopt(socket, ZMQ_EVENTS, &events, &len) != 0) {
        return 0;
    }
    return events & ZMQ_POLLIN;
}

static PyObject *wake_up(int force_tick) {
    if (!started) {
        PyErr_SetString(PyExc_RuntimeError, "_mdp_lru_loop: start() was not called");
        return NULL;
    }
    if (lane_running) {
        PyErr_SetString(PyExc_RuntimeError, "_mdp_lru_loop: the lane thread owns the sockets");
        return NULL;
    }
    double now = now_s();
    lru_wake(now, force_tick);
    for (int rounds = 0; has_input(backend) || has_input(frontend); rounds++) {
        if (rounds == MAX_ROUNDS) {
            st_again++;
            PyObject *done = PyObject_CallNoArgs(again_callback);
            if (done == NULL) {
                return NULL;
            }
            Py_DECREF(done);
            break;
        }
        drain(backend, 0, now);
        drain(frontend, 1, now);
    }
    Py_RETURN_NONE;
}

static PyObject *py_wake(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    (void)args;
    (void)nargs;
    return wake_up(0);
}

static PyObject *py_tick(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    (void)args;
    (void)nargs;
    return wake_up(1);
}

static void *handle_of(PyObject *value, const char *name) {
    void *handle = PyLong_AsVoidPtr(value);
    if (handle == NULL && !PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "_mdp_lru_loop.start: %s is a NULL socket handle", name);
    }
    return handle;
}

static PyObject *py_start(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *front, *back, *again;
    double heartbeat_ms;
    int live;
    if (!PyArg_ParseTuple(args, "OOdiO:start", &front, &back, &heartbeat_ms, &live, &again)) {
        return NULL;
    }
    if (heartbeat_ms <= 0 || live < 1) {
        PyErr_Format(PyExc_ValueError,
                     "_mdp_lru_loop.start: heartbeat_ms must be > 0 and liveness >= 1, not %R "
                     "and %d",
                     PyTuple_GET_ITEM(args, 2), live);
        return NULL;
    }
    if (!PyCallable_Check(again)) {
        PyErr_SetString(PyExc_TypeError, "_mdp_lru_loop.start: `again` must be callable");
        return NULL;
    }
    void *f = handle_of(front, "frontend");
    if (f == NULL) {
        return NULL;
    }
    void *b = handle_of(back, "backend");
    if (b == NULL) {
        return NULL;
    }
    if (started) {
        PyErr_SetString(PyExc_RuntimeError, "_mdp_lru_loop: already started (close() first)");
        return NULL;
    }
    frontend = f;
    backend = b;
    heartbeat_s = heartbeat_ms / 1000.0;
    liveness = live;
    next_tick = now_s() + heartbeat_s;
    Py_INCREF(again);
    Py_XSETREF(again_callback, again);
    started = 1;
    Py_RETURN_NONE;
}

/* The lane thread: mdp_lru.c's zmq_poll loop (lru_poll_loop), signals left to Python's thread. */
static void *lane_main(void *unused) {
    (void)unused;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    lru_poll_loop(&lane_stop, LANE_MAX_WAIT_MS, "mdp-lru-thread");
    return NULL;
}

static PyObject *py_run_thread(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (!started || lane_running) {
        PyErr_SetString(PyExc_RuntimeError,
                        "_mdp_lru_loop.run_thread: start() first, and at most one lane thread");
        return NULL;
    }
    lane_stop = 0;
    int err = pthread_create(&lane, NULL, lane_main, NULL);
    if (err != 0) {
        PyErr_Format(PyExc_OSError, "_mdp_lru_loop.run_thread: pthread_create: %s", strerror(err));
        return NULL;
    }
    lane_running = 1;
    Py_RETURN_NONE;
}

static PyObject *py_stop_thread(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (lane_running) {
        lane_stop = 1;
        Py_BEGIN_ALLOW_THREADS
        pthread_join(lane, NULL);
        Py_END_ALLOW_THREADS
        lane_running = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *py_stats(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    char line[256];
    int n = lru_stats_line(line, sizeof(line));
    if (n > 0 && (size_t)n < sizeof(line)) {
        snprintf(line + n, sizeof(line) - (size_t)n, " again=%llu", st_again);
    }
    return PyUnicode_FromString(line);
}

static PyObject *py_close(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (lane_running) {
        PyErr_SetString(PyExc_RuntimeError, "_mdp_lru_loop.close: stop_thread() first");
        return NULL;
    }
    lru_free();
    started = 0;
    Py_CLEAR(again_callback);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"start", py_start, METH_VARARGS, "start(frontend, backend, heartbeat_ms, liveness, again)"},
    {"wake", (PyCFunction)(void (*)(void))py_wake, METH_FASTCALL, "one wake-up"},
    {"tick", (PyCFunction)(void (*)(void))py_tick, METH_FASTCALL, "a wake-up with heartbeats"},
    {"run_thread", py_run_thread, METH_NOARGS, "run the lane in a thread of its own"},
    {"stop_thread", py_stop_thread, METH_NOARGS, "stop the lane thread and wait for it"},
    {"stats", py_stats, METH_NOARGS, "the counters, as mdp-lru prints them"},
    {"close", py_close, METH_NOARGS, "free the requests still waiting"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_mdp_lru_loop", "The strict-LRU floor's routing, called by a loop.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__mdp_lru_loop(void) { return PyModule_Create(&module); }
