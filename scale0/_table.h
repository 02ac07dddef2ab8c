/*
 * Hash tables of byte-string keys for Scale0's C extensions: the worker pool
 * (scale0/core/_pool.c) and the lane's session table (scale0/net/_lane.c) include this one copy.
 *
 * Open addressing, linear probing, backward-shift deletion (no tombstones), power-of-two sizes
 * at most 3/4 full, keys hashed by SipHash-1-3 under a per-process random key (s0_hash_seed,
 * once at import: routing ids come from peers, and a chosen-collision flood must not make a
 * lookup O(n)). Plain C: no Python API, no GIL needed; the caller serialises access.
 */
#ifndef S0_TABLE_H
#define S0_TABLE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/types.h>
#include <time.h>

/* ---- hashing ---------------------------------------------------------------------------- */

static uint64_t sip_k0, sip_k1; /* set once at import from getrandom(2) */

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                  \
    do {                                                                                          \
        v0 += v1;                                                                                 \
        v1 = ROTL(v1, 13);                                                                        \
        v1 ^= v0;                                                                                 \
        v0 = ROTL(v0, 32);                                                                        \
        v2 += v3;                                                                                 \
        v3 = ROTL(v3, 16);                                                                        \
        v3 ^= v2;                                                                                 \
        v0 += v3;                                                                                 \
        v3 = ROTL(v3, 21);                                                                        \
        v3 ^= v0;                                                                                 \
        v2 += v1;                                                                                 \
        v1 = ROTL(v1, 17);                                                                        \
        v1 ^= v2;                                                                                 \
        v2 = ROTL(v2, 32);                                                                        \
    } while (0)

static inline uint64_t hash_bytes(const unsigned char *p, size_t len) {
    uint64_t v0 = sip_k0 ^ 0x736f6d6570736575ULL, v1 = sip_k1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = sip_k0 ^ 0x6c7967656e657261ULL, v3 = sip_k1 ^ 0x7465646279746573ULL;
    uint64_t b = ((uint64_t)len) << 56, m;
    size_t whole = len & ~(size_t)7, i;
    for (i = 0; i < whole; i += 8) {
        memcpy(&m, p + i, 8);
        v3 ^= m;
        SIPROUND;
        v0 ^= m;
    }
    for (i = 0; i < (len & 7); i++)
        b |= (uint64_t)p[whole + i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* Set the hash key, once at import. */
static inline void s0_hash_seed(void) {
    uint64_t key[2];
    if (getrandom(key, sizeof(key), 0) != (ssize_t)sizeof(key)) {
        /* No entropy source: still working tables, only without the flood resistance. */
        key[0] = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)&key;
        key[1] = (uint64_t)clock() * 0x9e3779b97f4a7c15ULL;
    }
    sip_k0 = key[0];
    sip_k1 = key[1];
}

/* ---- keys and tables -------------------------------------------------------------------- */

/* The first member of every record a table holds: its key, stored right after the record. */
typedef struct {
    uint64_t hash;
    size_t len;
    unsigned char *data;
} s0_key;

typedef struct {
    s0_key **slots; /* NULL until the first insert */
    size_t mask;    /* size - 1 */
    size_t used;
} s0_table;

/* A record of `size` bytes whose first member is an s0_key, with the key's bytes after it. */
static inline void *record_new(size_t size, const unsigned char *data, size_t len,
                               uint64_t hash) {
    if (len > SIZE_MAX - size)
        return NULL;
    unsigned char *mem = calloc(1, size + len);
    if (mem == NULL)
        return NULL;
    s0_key *key = (s0_key *)mem;
    key->hash = hash;
    key->len = len;
    key->data = mem + size;
    if (len)
        memcpy(key->data, data, len);
    return mem;
}

static inline s0_key *table_find(const s0_table *t, const unsigned char *data, size_t len,
                          uint64_t hash) {
    if (t->slots == NULL)
        return NULL;
    for (size_t i = hash & t->mask;; i = (i + 1) & t->mask) {
        s0_key *k = t->slots[i];
        if (k == NULL)
            return NULL;
        if (k->hash == hash && k->len == len && (len == 0 || memcmp(k->data, data, len) == 0))
            return k;
    }
}

/* Room for `extra` more keys without a failure later: -1 (nothing changed) if out of memory. */
static inline int table_reserve(s0_table *t, size_t extra) {
    size_t size = t->slots ? t->mask + 1 : 0;
    size_t want = t->used + extra;
    if (want <= size / 4 * 3 && t->slots != NULL)
        return 0;
    size_t new_size = size ? size : 8;
    while (want > new_size / 4 * 3) {
        if (new_size > SIZE_MAX / 2 / sizeof(s0_key *))
            return -1;
        new_size *= 2;
    }
    s0_key **slots = calloc(new_size, sizeof(s0_key *));
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < size; i++) {
        s0_key *k = t->slots[i];
        if (k == NULL)
            continue;
        size_t j = k->hash & (new_size - 1);
        while (slots[j] != NULL)
            j = (j + 1) & (new_size - 1);
        slots[j] = k;
    }
    free(t->slots);
    t->slots = slots;
    t->mask = new_size - 1;
    return 0;
}

/* Insert a key not in the table, after table_reserve made room. */
static inline void table_insert(s0_table *t, s0_key *k) {
    size_t i = k->hash & t->mask;
    while (t->slots[i] != NULL)
        i = (i + 1) & t->mask;
    t->slots[i] = k;
    t->used++;
}

/* Remove a key that is in the table (this very record), shifting its run back. */
static inline void table_remove(s0_table *t, s0_key *k) {
    size_t i = k->hash & t->mask;
    while (t->slots[i] != k)
        i = (i + 1) & t->mask;
    for (size_t j = i;;) {
        j = (j + 1) & t->mask;
        s0_key *next = t->slots[j];
        if (next == NULL)
            break;
        size_t home = next->hash & t->mask;
        /* `next` may move to the hole at i only if its home is not in (i, j] (cyclically). */
        if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
            continue;
        t->slots[i] = next;
        i = j;
    }
    t->slots[i] = NULL;
    t->used--;
}

#endif
