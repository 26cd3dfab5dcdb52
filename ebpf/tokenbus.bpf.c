// SPDX-License-Identifier: Apache-2.0
/*
 * tokenbus.bpf.c - the eBPF control path of InfScaler-Edge (InfScaler paper, Sec. IV-B,
 * "eBPF-based event-driven sharing": token handover and token faults).
 *
 * One SK_MSG verdict program, attached (BPF_SK_MSG_VERDICT) to the SOCKMAP `socks`.
 * Every socket in the map is one end of a TCP loopback connection made by the manager
 * (ebpf/sockmap.py). When a process sends on such a socket, this program runs for
 * every 32-byte token (bpf_msg_apply_bytes(msg, 32): a batched send is routed token by
 * token) and redirects it, with BPF_F_INGRESS, into the receive queue of one socket of
 * the map:
 *
 *   - DATA for stage s      -> one live instance of s, round-robin (a cursor per sending
 *                              socket and stage, in socket-local storage: exact for any
 *                              number of producers) or least-loaded (fewest in-flight
 *                              tokens; ties broken by that cursor);
 *   - FAULT / FREE / other  -> the manager's ingress socket (MGR_IN_KEY);
 *   - sent by the manager's direct socket -> the instance named in the token's
 *                              `instance` field (GRANT / BUSY / ERROR replies, re-injected
 *                              DATA);
 *   - malformed (short, bad magic, bad CRC-32, unknown kind) -> the trash socket
 *                              (TRASH_KEY), counted; the manager discards those bytes;
 *   - unknown stage, stage without a live instance, a redirect that fails (empty map
 *                              slot, notes pitfall 4), a full in-flight table
 *                              -> the manager, counted. Never dropped: an SK_DROP verdict
 *                              makes every later send of that socket fail with EACCES
 *                              (sticky), so the program returns SK_DROP only when even
 *                              the manager's slot is gone (channel being closed).
 *
 * In-flight accounting: every DATA token redirected to an instance is recorded in the
 * hash `tracked` under (request, instance) with its 32 bytes; the per-slot counter
 * `inflight` counts those entries. The entry is removed (the token is acknowledged)
 * when that instance - identified by its socket, not by a token field - sends a DATA
 * (hand-over to the next stage) or FREE token with the same request id. The manager
 * reads the remaining entries of a dead instance to reclaim its tokens.
 *
 * Shared state the manager writes or reads (live masks, counters) lives in one global
 * struct in .bss, which the manager mmap()s (BPF_F_MMAPABLE, kernel >= 5.5).
 *
 * Kernel facts this relies on (checked against net/ipv4/tcp_bpf.c, net/core/skmsg.c):
 *   - every verdict is a redirect: within one batched send msg->sk_redir still holds
 *     the previous token's target, so a bare SK_PASS would silently go there too;
 *   - a send is parsed from its first byte in 32-byte steps; a trailing partial frame
 *     gets a verdict for exactly its own bytes (apply_bytes(size)), so the next send is
 *     aligned again; bpf_msg_cork_bytes is not used (a redirected cork frees the rest
 *     of the corked message);
 *   - a token that straddles two scatterlist pages is linearised with
 *     bpf_msg_pull_data before it is read;
 *   - loops are unrolled (notes pitfall 5); the round-robin cursor lives in the sending
 *     socket's storage, whose sends are serialised by the socket lock (pitfall 6).
 *
 * Sources: kernel Documentation/bpf/map_sockmap.rst (SK_MSG verdict,
 * bpf_msg_redirect_map, bpf_msg_apply_bytes, bpf_msg_pull_data), include/uapi/linux/bpf.h
 * (helper contracts), net/ipv4/tcp_bpf.c (tcp_bpf_send_verdict: why SK_PASS is never
 * returned here - msg->sk_redir survives between the runs for the tokens of one send),
 * shared/notes/ebpf.md (pitfalls 1-6, measured on kernel 6.18).
 *
 * Build: clang -O2 -g -target bpf -I/usr/include/$(uname -m)-linux-gnu -c tokenbus.bpf.c
 * (ebpf/build.py does it, with the -D limits below).
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#ifndef TB_MAX_STAGES
#define TB_MAX_STAGES 64 /* stages 0 .. TB_MAX_STAGES-1; power of two */
#endif
#ifndef TB_PER_STAGE
#define TB_PER_STAGE 16 /* instances per stage; power of two, <= 32 */
#endif
#ifndef TB_MAX_TRACKED
#define TB_MAX_TRACKED 65536 /* DATA tokens in flight (delivered, not acked), all instances */
#endif

#define TB_SLOTS (TB_MAX_STAGES * TB_PER_STAGE) /* instance sockets: key = stage * TB_PER_STAGE + index */
#define MGR_IN_KEY (TB_SLOTS + 0)     /* manager ingress: faults, frees, undeliverable tokens */
#define TRASH_KEY (TB_SLOTS + 1)      /* rejected bytes, discarded by the manager */
#define MGR_ROUTE_KEY (TB_SLOTS + 2)  /* manager sends DATA routed by stage (Channel.route) */
#define MGR_DIRECT_KEY (TB_SLOTS + 3) /* manager sends to one instance (Channel.manager_send) */
#define TB_SOCKS (TB_SLOTS + 4)

#define TOKEN_SIZE 32
#define TOKEN_MAGIC 0xA5

enum { K_DATA = 1, K_FAULT = 2, K_GRANT = 3, K_FREE = 4, K_BUSY = 5, K_ERROR = 6 };
enum { ROLE_NONE = 0, ROLE_INSTANCE = 1, ROLE_MGR_ROUTE = 2, ROLE_MGR_DIRECT = 3 };
enum { POLICY_ROUND_ROBIN = 0, POLICY_LEAST_LOADED = 1 };

/* Counter indexes: keep in sync with ebpf/sockmap.py COUNTERS. */
enum {
	C_DELIVERED = 0,       /* DATA redirected to an instance (routed or direct) */
	C_DIRECT = 1,          /* tokens from the manager's direct socket delivered */
	C_TO_MANAGER = 2,      /* valid tokens redirected to the manager (any reason) */
	C_ACKED = 3,           /* in-flight entries acknowledged */
	C_BAD_MAGIC = 4,       /* rejected: first byte is not 0xA5 */
	C_BAD_CRC = 5,         /* rejected: CRC-32 mismatch */
	C_BAD_KIND = 6,        /* rejected: kind not in 1..6 */
	C_SHORT = 7,           /* rejected: a send ended with fewer than 32 bytes */
	C_UNKNOWN_STAGE = 8,   /* DATA for a stage never registered (or >= TB_MAX_STAGES) -> manager */
	C_NO_INSTANCE = 9,     /* DATA for a registered stage with no live instance -> manager */
	C_REDIRECT_FAILED = 10, /* picked slot empty -> manager */
	C_INFLIGHT_FULL = 11,  /* `tracked` full -> manager */
	C_INFLIGHT_DUPLICATE = 12,   /* (request, instance) already in flight -> manager */
	C_DIRECT_UNKNOWN = 13, /* direct send to an instance without a slot -> manager */
	C_UNREGISTERED = 14,   /* sender without socket storage -> manager */
	C_PULL_FAILED = 15,    /* bpf_msg_pull_data failed -> trash */
	C_DROPPED = 16,        /* SK_DROP: manager / trash slot missing (channel closing) */
	C_PULLED = 17,         /* tokens that straddled two pages, linearised by pull_data */
	C_COUNTERS = 32,
};

/* Everything the manager mmap()s: mirror in ebpf/sockmap.py (_Shared). */
struct tb_shared {
	__u32 policy;
	__u32 pad0;
	__u32 live_mask[TB_MAX_STAGES];        /* bit i: slot stage*TB_PER_STAGE+i is routable */
	__u32 registered[TB_MAX_STAGES];       /* stage has had an instance */
	__u32 slot_instance[TB_SLOTS];         /* instance id in that slot */
	__s64 slot_inflight[TB_SLOTS];         /* DATA delivered and not acknowledged */
	__u64 slot_delivered[TB_SLOTS];
	__u64 slot_acked[TB_SLOTS];
	__u32 inst_slot[65536];                /* instance id -> slot + 1 (0: none) */
	__u64 counters[C_COUNTERS];
};

struct tb_shared tb_shared = {};

struct sock_info {
	__u32 instance;
	__u32 role;
	__u32 slot;
	__u32 pad;
	__u8 cursor[TB_MAX_STAGES]; /* round-robin cursor per destination stage */
};

struct track_key {
	__u64 request;
	__u32 instance;
	__u32 pad;
};

struct token_words {
	__u32 w[8];
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, TB_SOCKS);
	__type(key, __u32);
	__type(value, __u64);
} socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_info);
} sock_info SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TB_MAX_TRACKED);
	__type(key, struct track_key);
	__type(value, struct token_words);
} tracked SEC(".maps");

/* zlib's CRC-32 (reflected 0xEDB88320), as shm/token.py computes it over bytes 0..27. */
static const __u32 crc_table[256] = {
	0x00000000, 0x77073096, 0xee0e612c, 0x990951ba, 0x076dc419, 0x706af48f,
	0xe963a535, 0x9e6495a3, 0x0edb8832, 0x79dcb8a4, 0xe0d5e91e, 0x97d2d988,
	0x09b64c2b, 0x7eb17cbd, 0xe7b82d07, 0x90bf1d91, 0x1db71064, 0x6ab020f2,
	0xf3b97148, 0x84be41de, 0x1adad47d, 0x6ddde4eb, 0xf4d4b551, 0x83d385c7,
	0x136c9856, 0x646ba8c0, 0xfd62f97a, 0x8a65c9ec, 0x14015c4f, 0x63066cd9,
	0xfa0f3d63, 0x8d080df5, 0x3b6e20c8, 0x4c69105e, 0xd56041e4, 0xa2677172,
	0x3c03e4d1, 0x4b04d447, 0xd20d85fd, 0xa50ab56b, 0x35b5a8fa, 0x42b2986c,
	0xdbbbc9d6, 0xacbcf940, 0x32d86ce3, 0x45df5c75, 0xdcd60dcf, 0xabd13d59,
	0x26d930ac, 0x51de003a, 0xc8d75180, 0xbfd06116, 0x21b4f4b5, 0x56b3c423,
	0xcfba9599, 0xb8bda50f, 0x2802b89e, 0x5f058808, 0xc60cd9b2, 0xb10be924,
	0x2f6f7c87, 0x58684c11, 0xc1611dab, 0xb6662d3d, 0x76dc4190, 0x01db7106,
	0x98d220bc, 0xefd5102a, 0x71b18589, 0x06b6b51f, 0x9fbfe4a5, 0xe8b8d433,
	0x7807c9a2, 0x0f00f934, 0x9609a88e, 0xe10e9818, 0x7f6a0dbb, 0x086d3d2d,
	0x91646c97, 0xe6635c01, 0x6b6b51f4, 0x1c6c6162, 0x856530d8, 0xf262004e,
	0x6c0695ed, 0x1b01a57b, 0x8208f4c1, 0xf50fc457, 0x65b0d9c6, 0x12b7e950,
	0x8bbeb8ea, 0xfcb9887c, 0x62dd1ddf, 0x15da2d49, 0x8cd37cf3, 0xfbd44c65,
	0x4db26158, 0x3ab551ce, 0xa3bc0074, 0xd4bb30e2, 0x4adfa541, 0x3dd895d7,
	0xa4d1c46d, 0xd3d6f4fb, 0x4369e96a, 0x346ed9fc, 0xad678846, 0xda60b8d0,
	0x44042d73, 0x33031de5, 0xaa0a4c5f, 0xdd0d7cc9, 0x5005713c, 0x270241aa,
	0xbe0b1010, 0xc90c2086, 0x5768b525, 0x206f85b3, 0xb966d409, 0xce61e49f,
	0x5edef90e, 0x29d9c998, 0xb0d09822, 0xc7d7a8b4, 0x59b33d17, 0x2eb40d81,
	0xb7bd5c3b, 0xc0ba6cad, 0xedb88320, 0x9abfb3b6, 0x03b6e20c, 0x74b1d29a,
	0xead54739, 0x9dd277af, 0x04db2615, 0x73dc1683, 0xe3630b12, 0x94643b84,
	0x0d6d6a3e, 0x7a6a5aa8, 0xe40ecf0b, 0x9309ff9d, 0x0a00ae27, 0x7d079eb1,
	0xf00f9344, 0x8708a3d2, 0x1e01f268, 0x6906c2fe, 0xf762575d, 0x806567cb,
	0x196c3671, 0x6e6b06e7, 0xfed41b76, 0x89d32be0, 0x10da7a5a, 0x67dd4acc,
	0xf9b9df6f, 0x8ebeeff9, 0x17b7be43, 0x60b08ed5, 0xd6d6a3e8, 0xa1d1937e,
	0x38d8c2c4, 0x4fdff252, 0xd1bb67f1, 0xa6bc5767, 0x3fb506dd, 0x48b2364b,
	0xd80d2bda, 0xaf0a1b4c, 0x36034af6, 0x41047a60, 0xdf60efc3, 0xa867df55,
	0x316e8eef, 0x4669be79, 0xcb61b38c, 0xbc66831a, 0x256fd2a0, 0x5268e236,
	0xcc0c7795, 0xbb0b4703, 0x220216b9, 0x5505262f, 0xc5ba3bbe, 0xb2bd0b28,
	0x2bb45a92, 0x5cb36a04, 0xc2d7ffa7, 0xb5d0cf31, 0x2cd99e8b, 0x5bdeae1d,
	0x9b64c2b0, 0xec63f226, 0x756aa39c, 0x026d930a, 0x9c0906a9, 0xeb0e363f,
	0x72076785, 0x05005713, 0x95bf4a82, 0xe2b87a14, 0x7bb12bae, 0x0cb61b38,
	0x92d28e9b, 0xe5d5be0d, 0x7cdcefb7, 0x0bdbdf21, 0x86d3d2d4, 0xf1d4e242,
	0x68ddb3f8, 0x1fda836e, 0x81be16cd, 0xf6b9265b, 0x6fb077e1, 0x18b74777,
	0x88085ae6, 0xff0f6a70, 0x66063bca, 0x11010b5c, 0x8f659eff, 0xf862ae69,
	0x616bffd3, 0x166ccf45, 0xa00ae278, 0xd70dd2ee, 0x4e048354, 0x3903b3c2,
	0xa7672661, 0xd06016f7, 0x4969474d, 0x3e6e77db, 0xaed16a4a, 0xd9d65adc,
	0x40df0b66, 0x37d83bf0, 0xa9bcae53, 0xdebb9ec5, 0x47b2cf7f, 0x30b5ffe9,
	0xbdbdf21c, 0xcabac28a, 0x53b39330, 0x24b4a3a6, 0xbad03605, 0xcdd70693,
	0x54de5729, 0x23d967bf, 0xb3667a2e, 0xc4614ab8, 0x5d681b02, 0x2a6f2b94,
	0xb40bbe37, 0xc30c8ea1, 0x5a05df1b, 0x2d02ef8d,
};

static __always_inline void count(__u32 idx)
{
	__sync_fetch_and_add(&tb_shared.counters[idx & (C_COUNTERS - 1)], 1);
}

static __always_inline __u32 crc32_28(const struct token_words *t)
{
	__u32 crc = 0xffffffff;
	int i;

#pragma unroll
	for (i = 0; i < 28; i++) {
		__u32 byte = (t->w[i / 4] >> (8 * (i % 4))) & 0xff;

		crc = crc_table[(crc ^ byte) & 0xff] ^ (crc >> 8);
	}
	return ~crc;
}

/* Redirect the current token into the ingress of `key`; SK_DROP only if the slot is empty. */
static __always_inline int redirect(struct sk_msg_md *msg, __u32 key)
{
	return bpf_msg_redirect_map(msg, &socks, key, BPF_F_INGRESS);
}

static __always_inline int to_trash(struct sk_msg_md *msg, __u32 why)
{
	count(why);
	if (redirect(msg, TRASH_KEY) == SK_PASS)
		return SK_PASS;
	count(C_DROPPED);
	return SK_DROP;
}

static __always_inline int to_manager(struct sk_msg_md *msg, __u32 why)
{
	if (why != C_TO_MANAGER)
		count(why);
	count(C_TO_MANAGER);
	if (redirect(msg, MGR_IN_KEY) == SK_PASS)
		return SK_PASS;
	count(C_DROPPED);
	return SK_DROP;
}

/* Deliver a token to instance slot `slot`; DATA is tracked as in flight first. */
static __always_inline int deliver(struct sk_msg_md *msg, __u32 slot, __u32 kind,
				   const struct token_words *t, __u32 what)
{
	struct track_key key = {};
	long err;

	slot &= TB_SLOTS - 1;
	if (kind == K_DATA) {
		key.request = (__u64)t->w[5] | ((__u64)t->w[6] << 32);
		key.instance = tb_shared.slot_instance[slot];
		err = bpf_map_update_elem(&tracked, &key, t, BPF_NOEXIST);
		if (err == -17 /* EEXIST */)
			return to_manager(msg, C_INFLIGHT_DUPLICATE);
		if (err)
			return to_manager(msg, C_INFLIGHT_FULL);
	}
	if (redirect(msg, slot) != SK_PASS) {
		if (kind == K_DATA)
			bpf_map_delete_elem(&tracked, &key);
		return to_manager(msg, C_REDIRECT_FAILED);
	}
	if (kind == K_DATA) {
		__sync_fetch_and_add(&tb_shared.slot_inflight[slot], 1);
		__sync_fetch_and_add(&tb_shared.slot_delivered[slot], 1);
		count(C_DELIVERED);
	}
	if (what != C_DELIVERED)
		count(what);
	return SK_PASS;
}

/* Pick a live instance of `stage` (mask != 0) by the configured policy. */
static __always_inline __u32 pick(struct sock_info *si, __u32 stage, __u32 mask)
{
	__u32 cur = si->cursor[stage & (TB_MAX_STAGES - 1)] & (TB_PER_STAGE - 1);
	__u32 base = (stage & (TB_MAX_STAGES - 1)) * TB_PER_STAGE;
	__u32 chosen = TB_PER_STAGE; /* none */
	__s64 best = 0x7fffffffffffffffLL;
	int i;

	if (tb_shared.policy == POLICY_ROUND_ROBIN) {
#pragma unroll
		for (i = 0; i < TB_PER_STAGE; i++) {
			__u32 idx = (cur + i) & (TB_PER_STAGE - 1);

			if ((mask >> idx) & 1) {
				chosen = idx;
				break;
			}
		}
	} else {
#pragma unroll
		for (i = 0; i < TB_PER_STAGE; i++) {
			__u32 idx = (cur + i) & (TB_PER_STAGE - 1);

			if ((mask >> idx) & 1) {
				__s64 load = tb_shared.slot_inflight[(base + idx) & (TB_SLOTS - 1)];

				if (load < best) {
					best = load;
					chosen = idx;
				}
			}
		}
	}
	if (chosen < TB_PER_STAGE)
		si->cursor[stage & (TB_MAX_STAGES - 1)] = (chosen + 1) & (TB_PER_STAGE - 1);
	return chosen;
}

SEC("sk_msg")
int tokenbus_verdict(struct sk_msg_md *msg)
{
	struct token_words t;
	struct sock_info *si;
	struct bpf_sock *sk;
	void *data, *data_end;
	__u32 kind, stage, mask, chosen;
	int i;

	if (msg->size < TOKEN_SIZE) {
		/* A send that ends in a partial frame: the verdict covers exactly these bytes,
		 * so the sender's next send is parsed from its own first byte again. */
		bpf_msg_apply_bytes(msg, msg->size);
		return to_trash(msg, C_SHORT);
	}
	/* The verdict covers one token; the program runs again for the next 32 bytes. */
	bpf_msg_apply_bytes(msg, TOKEN_SIZE);

	data = msg->data;
	data_end = msg->data_end;
	if (data + TOKEN_SIZE > data_end) {
		/* The token straddles two scatterlist pages: make it linear. */
		if (bpf_msg_pull_data(msg, 0, TOKEN_SIZE, 0))
			return to_trash(msg, C_PULL_FAILED);
		data = msg->data;
		data_end = msg->data_end;
		if (data + TOKEN_SIZE > data_end)
			return to_trash(msg, C_PULL_FAILED);
		count(C_PULLED);
	}
#pragma unroll
	for (i = 0; i < 8; i++)
		t.w[i] = ((__u32 *)data)[i];

	if ((t.w[0] & 0xff) != TOKEN_MAGIC)
		return to_trash(msg, C_BAD_MAGIC);
	if (crc32_28(&t) != t.w[7])
		return to_trash(msg, C_BAD_CRC);
	kind = (t.w[0] >> 8) & 0xff;
	if (kind < K_DATA || kind > K_ERROR)
		return to_trash(msg, C_BAD_KIND);
	stage = t.w[0] >> 16;

	sk = msg->sk;
	if (!sk)
		return to_manager(msg, C_UNREGISTERED);
	si = bpf_sk_storage_get(&sock_info, sk, 0, 0);
	if (!si)
		return to_manager(msg, C_UNREGISTERED);

	if (si->role == ROLE_MGR_DIRECT) {
		__u32 instance = t.w[1] >> 16;
		__u32 slot1 = tb_shared.inst_slot[instance & 0xffff];

		if (!slot1)
			return to_manager(msg, C_DIRECT_UNKNOWN);
		return deliver(msg, slot1 - 1, kind, &t, C_DIRECT);
	}

	/* Acknowledgement: a DATA or FREE sent by an instance closes its in-flight entry. */
	if (si->role == ROLE_INSTANCE && (kind == K_DATA || kind == K_FREE)) {
		struct track_key key = {};

		key.request = (__u64)t.w[5] | ((__u64)t.w[6] << 32);
		key.instance = si->instance;
		if (bpf_map_delete_elem(&tracked, &key) == 0) {
			__u32 own = si->slot & (TB_SLOTS - 1);

			__sync_fetch_and_add(&tb_shared.slot_inflight[own], -1);
			__sync_fetch_and_add(&tb_shared.slot_acked[own], 1);
			count(C_ACKED);
		}
	}

	if (kind != K_DATA)
		return to_manager(msg, C_TO_MANAGER);

	if (stage >= TB_MAX_STAGES || !tb_shared.registered[stage & (TB_MAX_STAGES - 1)])
		return to_manager(msg, C_UNKNOWN_STAGE);
	mask = tb_shared.live_mask[stage & (TB_MAX_STAGES - 1)];
	if (!mask)
		return to_manager(msg, C_NO_INSTANCE);
	chosen = pick(si, stage, mask);
	if (chosen >= TB_PER_STAGE)
		return to_manager(msg, C_NO_INSTANCE);
	return deliver(msg, stage * TB_PER_STAGE + chosen, K_DATA, &t, C_DELIVERED);
}

char LICENSE[] SEC("license") = "Apache-2.0";
