/*
 * wanem: a user-space WAN emulator for the namespace lab (this kernel has no netem).
 *
 * Two TAP devices, A and B, are bridged through one timed queue per direction. A frame
 * the kernel transmits on A is read here and, after the A->B direction's impairments,
 * written to B (where the kernel receives it), and the other way round:
 *
 *   arrival -> random loss -> rate (a serializer with a tail-drop queue) -> delay + jitter
 *           -> FIFO release at its time
 *
 * - loss: each frame is lost with probability `loss` (Bernoulli, seeded RNG), before the
 *   queue, like netem's loss: a lost frame uses no link time;
 * - rate: frames leave a serializer of `rate_mbit` one after another (frame bytes, the
 *   14-byte Ethernet header included, as tbf and netem count them); a frame that finds
 *   more than `queue_ms` of backlog ahead of it is dropped (a router's tail-drop buffer);
 *   rate 0 means no serializer;
 * - delay and jitter: each frame then waits `delay_ms` plus a uniform sample of
 *   +-`jitter_ms`; frames never overtake each other (a release time is at least the
 *   previous one's), so jitter does not reorder a flow, as on one WAN path.
 *
 * - delivery: frames due are written out at most every `--coalesce-us` (default 0: as each
 *   is due), like a NIC's interrupt moderation, and back-to-back datagrams of one UDP flow
 *   among them go to the kernel as one UDP GSO packet (IFF_VNET_HDR), as the NIC's GRO
 *   would hand them up: a writev per frame would give the kernel no batch to GRO, and
 *   every datagram would cross the bridge and the stack alone.
 *
 * The devices are created in the namespace wanem runs in; the caller moves them where it
 * wants them (into two hosts' namespaces, or onto two bridges). They disappear when wanem
 * exits, wherever they are. Nothing here configures addresses or routes.
 *
 * Control: one command per line on stdin, one answer line on stdout. EOF on stdin ends
 * the program (so it never outlives the process that started it).
 *   stats                               -> {"ab": {...}, "ba": {...}}
 *   set ab|ba|both key=value[,key=value] -> ok | error ...
 *   quit
 * Keys: delay_ms, jitter_ms, loss, rate_mbit, queue_ms.
 *
 *   wanem run --tap-a NAME --tap-b NAME [--ab SPEC] [--ba SPEC] [--seed N] [--buffer-mb M]
 *             [--coalesce-us U]
 *   wanem feature DEV gro|tso|gso [on|off]   an offload flag of a device (legacy ethtool
 *                                            ioctls: this machine has no ethtool)
 *
 * Build: cc -O2 -Wall -o wanem wanem.c (tests/wan.py does this).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/ethtool.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <linux/sockios.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_FRAME 65550 /* a frame read from a TAP without offloads is MTU + 14 */
#define ENT_ALIGN 16
#define WRAP_MARK 0xffffffffu
#define READ_BUDGET 256 /* frames read per device per wake: the other side gets a turn */
#define EARLY_NS 20000  /* release frames due within 20 us: fewer wakes, 0.02% of 100 ms */
#define MAX_SEGS 64     /* frames released per batch; UDP segments per coalesced write */
#define ETH_HLEN 14
#define UDP_HLEN (ETH_HLEN + 20 + 8) /* Ethernet, IPv4 without options, UDP */
#define GSO_UDP_L4 5                 /* VIRTIO_NET_HDR_GSO_UDP_L4 (Linux >= 6.2 headers) */

/* struct virtio_net_hdr, native endian (what a TAP with IFF_VNET_HDR uses on x86) */
struct vnet_hdr {
    uint8_t flags, gso_type;
    uint16_t hdr_len, gso_size, csum_start, csum_offset;
};

static uint64_t coalesce_ns; /* --coalesce-us: the receiving "NIC"'s interrupt moderation */

struct params {
    double delay_ms, jitter_ms, loss, rate_mbit, queue_ms;
};

struct stats {
    uint64_t frames, bytes, lost, dropped, overflow, delivered, delivered_bytes, write_errors;
    uint64_t max_backlog_bytes, writes, coalesced;
};

struct ent {
    uint64_t t;   /* release time, CLOCK_MONOTONIC ns */
    uint32_t len; /* frame length, or WRAP_MARK */
    uint32_t pad;
};

struct dir {
    const char *name;
    int in_fd, out_fd;
    struct params p;
    uint64_t link_free; /* when the serializer is idle again */
    uint64_t last_release;
    uint64_t last_wake; /* when frames were last written out (coalescing) */
    uint8_t *buf;
    size_t cap, head, tail, used;
    struct stats s;
};

static uint64_t rng_state;

static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double rng_unit(void) { return (rng_next() >> 11) * (1.0 / 9007199254740992.0); }

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "wanem: %s: %s\n", what, strerror(errno));
    exit(1);
}

static size_t align_up(size_t n) { return (n + ENT_ALIGN - 1) & ~(size_t)(ENT_ALIGN - 1); }

/* Where the next frame can be read to (MAX_FRAME contiguous bytes), or NULL if full. */
static struct ent *ring_reserve(struct dir *d) {
    size_t need = align_up(sizeof(struct ent) + MAX_FRAME);
    if (d->used == 0)
        d->head = d->tail = 0;
    if (d->tail + need <= d->cap) {
        if (d->used + need > d->cap)
            return NULL;
        return (struct ent *)(d->buf + d->tail);
    }
    /* wrap: the bytes left at the end are skipped (a marker says so) */
    size_t waste = d->cap - d->tail;
    if (d->used + waste + need > d->cap || d->head < need)
        return NULL;
    if (waste >= sizeof(struct ent))
        ((struct ent *)(d->buf + d->tail))->len = WRAP_MARK;
    d->used += waste;
    d->tail = 0;
    return (struct ent *)d->buf;
}

static void ring_commit(struct dir *d, struct ent *e) {
    size_t size = align_up(sizeof(struct ent) + e->len);
    d->tail += size;
    d->used += size;
    if (d->tail == d->cap)
        d->tail = 0;
}

static struct ent *ring_peek(struct dir *d) {
    if (d->used == 0)
        return NULL;
    if (d->cap - d->head < sizeof(struct ent) ||
        ((struct ent *)(d->buf + d->head))->len == WRAP_MARK) {
        d->used -= d->cap - d->head;
        d->head = 0;
        if (d->used == 0)
            return NULL;
    }
    return (struct ent *)(d->buf + d->head);
}

static void ring_pop(struct dir *d, struct ent *e) {
    size_t size = align_up(sizeof(struct ent) + e->len);
    d->head += size;
    d->used -= size;
    if (d->head == d->cap)
        d->head = 0;
}

/* A frame of `len` bytes arrived at `now`: its release time, or 0 if it is lost/dropped. */
static uint64_t admit(struct dir *d, uint32_t len, uint64_t now) {
    d->s.frames++;
    d->s.bytes += len;
    if (d->p.loss > 0 && rng_unit() < d->p.loss) {
        d->s.lost++;
        return 0;
    }
    uint64_t t = now;
    if (d->p.rate_mbit > 0) {
        double ns_per_byte = 8e3 / d->p.rate_mbit;
        uint64_t backlog_ns = d->link_free > now ? d->link_free - now : 0;
        double backlog = backlog_ns / ns_per_byte;
        double limit = d->p.queue_ms * 1e6 / ns_per_byte;
        if (backlog > 0 && backlog + len > limit) {
            d->s.dropped++;
            return 0;
        }
        if ((uint64_t)backlog > d->s.max_backlog_bytes)
            d->s.max_backlog_bytes = (uint64_t)backlog;
        uint64_t start = d->link_free > now ? d->link_free : now;
        d->link_free = start + (uint64_t)(len * ns_per_byte);
        t = d->link_free;
    }
    double extra = d->p.delay_ms * 1e6;
    if (d->p.jitter_ms > 0)
        extra += (2 * rng_unit() - 1) * d->p.jitter_ms * 1e6;
    if (extra > 0)
        t += (uint64_t)extra;
    if (t < d->last_release)
        t = d->last_release; /* FIFO: no overtaking */
    d->last_release = t;
    return t;
}

static void read_frames(struct dir *d) {
    uint64_t now = now_ns();
    for (int i = 0; i < READ_BUDGET; i++) {
        static uint64_t scratch[(sizeof(struct ent) + MAX_FRAME) / 8 + 1];
        struct ent *e = ring_reserve(d);
        int full = e == NULL;
        if (full)
            e = (struct ent *)scratch;
        struct vnet_hdr vh;
        struct iovec iov[2] = {{&vh, sizeof vh}, {(uint8_t *)(e + 1), MAX_FRAME}};
        ssize_t n = readv(d->in_fd, iov, 2);
        if (n >= 0 && (n < (ssize_t)sizeof vh || vh.gso_type != 0)) {
            d->s.write_errors++; /* no offloads were offered: never a GSO frame */
            continue;
        }
        if (n > 0)
            n -= sizeof vh;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            die("read");
        }
        if (n == 0)
            return;
        if (full) {
            d->s.frames++;
            d->s.bytes += n;
            d->s.overflow++;
            continue;
        }
        e->len = (uint32_t)n;
        e->t = admit(d, e->len, now);
        if (e->t)
            ring_commit(d, e);
        if ((i & 31) == 31)
            now = now_ns();
    }
}

/* Payload bytes of an IPv4 UDP frame without options or fragmentation, or -1. */
static long udp_payload(const uint8_t *f, uint32_t len) {
    if (len < UDP_HLEN || f[12] != 0x08 || f[13] != 0x00)
        return -1;
    const uint8_t *ip = f + ETH_HLEN;
    if (ip[0] != 0x45 || ip[9] != 17 || ((ip[6] << 8 | ip[7]) & 0x3fff))
        return -1;
    uint32_t total = ip[2] << 8 | ip[3], udp = ip[24] << 8 | ip[25];
    if (total != len - ETH_HLEN || udp != total - 20)
        return -1;
    return (long)udp - 8;
}

static int same_flow(const uint8_t *a, const uint8_t *b) {
    return !memcmp(a, b, 12) && !memcmp(a + 26, b + 26, 12) && a[15] == b[15] && a[22] == b[22];
}

static uint16_t fold(uint32_t sum) {
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return (uint16_t)sum;
}

static void write_one(struct dir *d, struct iovec *iov, int n, uint32_t bytes, int frames) {
    ssize_t w;
    do
        w = writev(d->out_fd, iov, n);
    while (w < 0 && errno == EINTR);
    d->s.writes++;
    if (w < 0) {
        d->s.write_errors++;
    } else {
        d->s.delivered += frames;
        d->s.delivered_bytes += bytes;
    }
}

/* Write frames out in order. Back-to-back datagrams of one UDP flow (same size but the
 * last) go as one UDP GSO packet, as a NIC's GRO would hand them to the kernel: a socket
 * with UDP_GRO receives them in one read, any other gets them segmented again. */
static void write_frames(struct dir *d, struct ent **batch, int n) {
    struct iovec iov[MAX_SEGS + 2];
    for (int i = 0; i < n;) {
        uint8_t *f = (uint8_t *)(batch[i] + 1);
        long seg = coalesce_ns ? udp_payload(f, batch[i]->len) : -1;
        int j = i + 1;
        long total = seg;
        if (seg > 0) {
            while (j < n && j - i < MAX_SEGS) {
                uint8_t *g = (uint8_t *)(batch[j] + 1);
                long p = udp_payload(g, batch[j]->len);
                if (p <= 0 || p > seg || !same_flow(f, g) || total + p + 28 > 65535)
                    break;
                total += p;
                j++;
                if (p < seg)
                    break; /* a shorter datagram ends a GSO packet */
            }
        }
        if (j - i < 2) {
            struct vnet_hdr vh = {0};
            iov[0] = (struct iovec){&vh, sizeof vh};
            iov[1] = (struct iovec){f, batch[i]->len};
            write_one(d, iov, 2, batch[i]->len, 1);
            i++;
            continue;
        }
        uint8_t head[UDP_HLEN];
        memcpy(head, f, UDP_HLEN);
        uint8_t *ip = head + ETH_HLEN, *udp = ip + 20;
        uint32_t udp_len = (uint32_t)total + 8, ip_len = udp_len + 20;
        ip[2] = ip_len >> 8, ip[3] = ip_len & 0xff, ip[10] = ip[11] = 0;
        uint32_t sum = 0;
        for (int k = 0; k < 20; k += 2)
            sum += ip[k] << 8 | ip[k + 1];
        uint16_t ipsum = ~fold(sum);
        ip[10] = ipsum >> 8, ip[11] = ipsum & 0xff;
        udp[4] = udp_len >> 8, udp[5] = udp_len & 0xff;
        /* CHECKSUM_PARTIAL: the pseudo-header sum; segmentation completes each datagram's */
        sum = 17 + udp_len;
        for (int k = 12; k < 20; k += 2)
            sum += ip[k] << 8 | ip[k + 1];
        uint16_t pseudo = fold(sum);
        udp[6] = pseudo >> 8, udp[7] = pseudo & 0xff;
        struct vnet_hdr vh = {
            .flags = 1, /* VIRTIO_NET_HDR_F_NEEDS_CSUM */
            .gso_type = GSO_UDP_L4,
            .hdr_len = UDP_HLEN,
            .gso_size = (uint16_t)seg,
            .csum_start = ETH_HLEN + 20,
            .csum_offset = 6,
        };
        iov[0] = (struct iovec){&vh, sizeof vh};
        iov[1] = (struct iovec){head, UDP_HLEN};
        uint32_t bytes = 0;
        for (int k = i; k < j; k++) {
            iov[2 + k - i] =
                (struct iovec){(uint8_t *)(batch[k] + 1) + UDP_HLEN, batch[k]->len - UDP_HLEN};
            bytes += batch[k]->len;
        }
        write_one(d, iov, 2 + j - i, bytes, j - i);
        d->s.coalesced += j - i;
        i = j;
    }
}

static void release_due(struct dir *d, uint64_t now) {
    struct ent *batch[MAX_SEGS], *e;
    d->last_wake = now;
    for (;;) {
        int n = 0;
        while (n < MAX_SEGS && (e = ring_peek(d)) != NULL && e->t <= now + EARLY_NS) {
            batch[n++] = e;
            ring_pop(d, e); /* its bytes stay until the next read_frames() */
        }
        if (n)
            write_frames(d, batch, n);
        if (n < MAX_SEGS)
            return;
    }
}

/* When this direction next writes frames out: its head's time, but not before one
 * coalescing interval after the last write. UINT64_MAX if nothing is queued. */
static uint64_t release_at(struct dir *d) {
    struct ent *e = ring_peek(d);
    if (!e)
        return UINT64_MAX;
    uint64_t t = e->t > EARLY_NS ? e->t - EARLY_NS : 0;
    if (coalesce_ns && t < d->last_wake + coalesce_ns)
        t = d->last_wake + coalesce_ns;
    return t;
}

static int set_param(struct params *p, const char *key, double v) {
    if (!strcmp(key, "delay_ms") && v >= 0)
        p->delay_ms = v;
    else if (!strcmp(key, "jitter_ms") && v >= 0)
        p->jitter_ms = v;
    else if (!strcmp(key, "loss") && v >= 0 && v <= 1)
        p->loss = v;
    else if (!strcmp(key, "rate_mbit") && v >= 0)
        p->rate_mbit = v;
    else if (!strcmp(key, "queue_ms") && v > 0)
        p->queue_ms = v;
    else
        return -1;
    return 0;
}

/* "delay_ms=50,loss=0.005" -> p; returns -1 (and leaves p partly set) on a bad item. */
static int parse_spec(struct params *p, const char *spec) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq)
            return -1;
        *eq = 0;
        char *end;
        double v = strtod(eq + 1, &end);
        if (end == eq + 1 || *end || !isfinite(v) || set_param(p, item, v))
            return -1;
    }
    return 0;
}

static void print_dir(FILE *out, struct dir *d) {
    fprintf(out,
            "\"%s\": {\"delay_ms\": %g, \"jitter_ms\": %g, \"loss\": %g, \"rate_mbit\": %g, "
            "\"queue_ms\": %g, \"frames\": %llu, \"bytes\": %llu, \"lost\": %llu, "
            "\"dropped\": %llu, \"overflow\": %llu, \"delivered\": %llu, "
            "\"delivered_bytes\": %llu, \"write_errors\": %llu, \"max_backlog_bytes\": %llu, "
            "\"queued_bytes\": %zu, \"writes\": %llu, \"coalesced\": %llu}",
            d->name, d->p.delay_ms, d->p.jitter_ms, d->p.loss, d->p.rate_mbit, d->p.queue_ms,
            (unsigned long long)d->s.frames, (unsigned long long)d->s.bytes,
            (unsigned long long)d->s.lost, (unsigned long long)d->s.dropped,
            (unsigned long long)d->s.overflow, (unsigned long long)d->s.delivered,
            (unsigned long long)d->s.delivered_bytes, (unsigned long long)d->s.write_errors,
            (unsigned long long)d->s.max_backlog_bytes, d->used,
            (unsigned long long)d->s.writes, (unsigned long long)d->s.coalesced);
}

/* One command line; returns 0 to go on, 1 to quit. */
static int command(char *line, struct dir *ab, struct dir *ba) {
    line[strcspn(line, "\r\n")] = 0;
    if (!strcmp(line, "stats")) {
        fputc('{', stdout);
        print_dir(stdout, ab);
        fputs(", ", stdout);
        print_dir(stdout, ba);
        fputs("}\n", stdout);
    } else if (!strncmp(line, "set ", 4)) {
        char which[8];
        int off = 0;
        if (sscanf(line + 4, "%7s %n", which, &off) != 1 || off == 0) {
            puts("error: set ab|ba|both key=value,...");
        } else {
            struct params pa = ab->p, pb = ba->p;
            int bad = 0;
            if (!strcmp(which, "ab") || !strcmp(which, "both"))
                bad |= parse_spec(&pa, line + 4 + off);
            if (!strcmp(which, "ba") || !strcmp(which, "both"))
                bad |= parse_spec(&pb, line + 4 + off);
            if (strcmp(which, "ab") && strcmp(which, "ba") && strcmp(which, "both"))
                bad = 1;
            if (bad) {
                puts("error: bad direction or key=value (keys: delay_ms, jitter_ms, loss, "
                     "rate_mbit, queue_ms)");
            } else {
                ab->p = pa;
                ba->p = pb;
                puts("ok");
            }
        }
    } else if (!strcmp(line, "quit")) {
        puts("bye");
        fflush(stdout);
        return 1;
    } else if (*line) {
        puts("error: commands are stats, set, quit");
    }
    fflush(stdout);
    return 0;
}

static int open_tap(const char *name) {
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        die("open /dev/net/tun");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0)
        die(name);
    int size = sizeof(struct vnet_hdr);
    if (ioctl(fd, TUNSETVNETHDRSZ, &size) < 0)
        die("TUNSETVNETHDRSZ");
    /* no offloads: the kernel hands us finished, MTU-sized frames (it segments GSO
     * packets and fills checksums first), so loss and rate apply per frame */
    if (ioctl(fd, TUNSETOFFLOAD, 0) < 0)
        die("TUNSETOFFLOAD");
    return fd;
}

static size_t ring_bytes(struct params *p, double buffer_mb) {
    if (buffer_mb > 0)
        return (size_t)(buffer_mb * (1 << 20));
    /* frames in flight: the queue plus the delay at the rate (10 Gbit/s if unlimited),
     * twice, for the per-frame header and a wrap; at least 16 MiB */
    double rate = (p->rate_mbit > 0 ? p->rate_mbit : 10000) * 1e6 / 8;
    double seconds = (p->delay_ms + p->jitter_ms + (p->rate_mbit > 0 ? p->queue_ms : 0)) / 1e3;
    double bytes = 2 * rate * seconds + (16 << 20);
    return bytes > 4e9 ? (size_t)4e9 : (size_t)bytes;
}

static int run(int argc, char **argv) {
    const char *tap_a = NULL, *tap_b = NULL;
    struct params def = {0, 0, 0, 0, 50};
    struct dir ab = {.name = "ab", .p = def}, ba = {.name = "ba", .p = def};
    double buffer_mb = 0;
    rng_state = 1;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val) {
            fprintf(stderr, "wanem: %s needs a value\n", arg);
            return 2;
        }
        i++;
        if (!strcmp(arg, "--tap-a"))
            tap_a = val;
        else if (!strcmp(arg, "--tap-b"))
            tap_b = val;
        else if (!strcmp(arg, "--ab") && !parse_spec(&ab.p, val))
            ;
        else if (!strcmp(arg, "--ba") && !parse_spec(&ba.p, val))
            ;
        else if (!strcmp(arg, "--seed"))
            rng_state = strtoull(val, NULL, 0);
        else if (!strcmp(arg, "--buffer-mb"))
            buffer_mb = strtod(val, NULL);
        else if (!strcmp(arg, "--coalesce-us"))
            coalesce_ns = (uint64_t)(strtod(val, NULL) * 1e3);
        else {
            fprintf(stderr, "wanem: bad option %s %s\n", arg, val);
            return 2;
        }
    }
    if (!tap_a || !tap_b) {
        fprintf(stderr, "wanem: --tap-a and --tap-b are required\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_TIMERSLACK, 1000UL); /* wake within ~1 us of a release time, not 50 us */
    ab.in_fd = open_tap(tap_a);
    ba.in_fd = open_tap(tap_b);
    ab.out_fd = ba.in_fd;
    ba.out_fd = ab.in_fd;
    ab.cap = ring_bytes(&ab.p, buffer_mb) & ~(size_t)(ENT_ALIGN - 1);
    ba.cap = ring_bytes(&ba.p, buffer_mb) & ~(size_t)(ENT_ALIGN - 1);
    ab.buf = malloc(ab.cap);
    ba.buf = malloc(ba.cap);
    if (!ab.buf || !ba.buf)
        die("malloc");
    printf("ready %s %s\n", tap_a, tap_b);
    fflush(stdout);

    char line[1024];
    size_t line_len = 0;
    struct pollfd fds[3] = {
        {.fd = ab.in_fd, .events = POLLIN},
        {.fd = ba.in_fd, .events = POLLIN},
        {.fd = 0, .events = POLLIN},
    };
    for (;;) {
        uint64_t now = now_ns();
        if (release_at(&ab) <= now)
            release_due(&ab, now);
        if (release_at(&ba) <= now)
            release_due(&ba, now);
        uint64_t next = release_at(&ab), other = release_at(&ba);
        if (other < next)
            next = other;
        struct timespec ts, *tsp = NULL;
        if (next != UINT64_MAX) {
            uint64_t wait = next > now ? next - now : 0;
            ts.tv_sec = wait / 1000000000ULL;
            ts.tv_nsec = wait % 1000000000ULL;
            tsp = &ts;
        }
        int n = ppoll(fds, 3, tsp, NULL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("ppoll");
        }
        if (fds[0].revents & POLLIN)
            read_frames(&ab);
        if (fds[1].revents & POLLIN)
            read_frames(&ba);
        if ((fds[0].revents | fds[1].revents) & (POLLERR | POLLHUP | POLLNVAL)) {
            fprintf(stderr, "wanem: a TAP device went away\n");
            return 1;
        }
        if (fds[2].revents) {
            ssize_t got = read(0, line + line_len, sizeof line - 1 - line_len);
            if (got <= 0)
                return 0; /* EOF: our parent is gone */
            line_len += (size_t)got;
            line[line_len] = 0;
            char *nl;
            while ((nl = strchr(line, '\n')) != NULL) {
                *nl = 0;
                if (command(line, &ab, &ba))
                    return 0;
                size_t rest = line_len - (size_t)(nl + 1 - line);
                memmove(line, nl + 1, rest);
                line_len = rest;
                line[line_len] = 0;
            }
            if (line_len == sizeof line - 1)
                line_len = 0; /* an overlong line: drop it */
        }
    }
}

/* wanem feature DEV gro|tso|gso [on|off]: a legacy ethtool offload flag (no ethtool here). */
static int feature(int argc, char **argv) {
    static const struct {
        const char *name;
        unsigned get, set;
    } flags[] = {
        {"gro", ETHTOOL_GGRO, ETHTOOL_SGRO},
        {"tso", ETHTOOL_GTSO, ETHTOOL_STSO},
        {"gso", ETHTOOL_GGSO, ETHTOOL_SGSO},
    };
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: wanem feature DEV gro|tso|gso [on|off]\n");
        return 2;
    }
    int which = -1;
    for (unsigned i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(argv[3], flags[i].name))
            which = (int)i;
    if (which < 0) {
        fprintf(stderr, "wanem: unknown feature %s\n", argv[3]);
        return 2;
    }
    int sock = socket(AF_INET, SOCK_DGRAM, 0);
    if (sock < 0)
        die("socket");
    struct ethtool_value ev = {.cmd = flags[which].get};
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", argv[2]);
    ifr.ifr_data = (void *)&ev;
    if (argc == 5) {
        ev.cmd = flags[which].set;
        ev.data = !strcmp(argv[4], "on");
        if (ioctl(sock, SIOCETHTOOL, &ifr) < 0)
            die(argv[2]);
        ev.cmd = flags[which].get;
    }
    if (ioctl(sock, SIOCETHTOOL, &ifr) < 0)
        die(argv[2]);
    printf("%s %s %s\n", argv[2], argv[3], ev.data ? "on" : "off");
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "run"))
        return run(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "feature"))
        return feature(argc, argv);
    fprintf(stderr, "usage: wanem run --tap-a A --tap-b B [--ab SPEC] [--ba SPEC] [--seed N]\n"
                    "       wanem feature DEV gro|tso|gso [on|off]\n");
    return 2;
}
