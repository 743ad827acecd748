// The row protocol of a realisable policy, written once. For each query, in position
// order, and each KV head of a layer:
//   1. append: the query's own key enters the head's LayerState as its newest slot;
//   2. visibility: the query sees the slots that the policy's pattern (LayerState::visible),
//      the model's sliding window and causality all allow;
//   3. attention: the softmax of the query's logits over those slots, zero elsewhere;
//   4. observe: the policy sees that attention, for each query head of the KV head's group
//      (not for a query that no compression will read: LayerState::observation_window);
//   5. compress: after the prefill, the policy evicts back to its budget (also after each
//      block of the prefill for a policy that asks, RealisablePolicy::prefill_block).
// Sim mode (one teacher-forced pass), the decode cache and analyze's recall all drive
// their policies through this class, so a policy cannot tell them apart. Whether heads
// run on threads of their own is decided here: heads that do not share a decision
// (LayerStates::lockstep false) each take a whole block of queries on one thread; their
// arithmetic is the same on any number of threads.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "policies/policy.h"

namespace kvevict {

// Where a slot's key sits in a logits row.
enum class SlotColumns {
  // Column = position: a pass over the whole sequence (analyze; sim mode for a policy that
  // rewrites slots).
  Positions,
  // Column = the cache row holding the key (decode mode). A head's new key goes to its
  // next free row (row size() before the append), and an eviction moves each kept key
  // that sits at or beyond the kept count into a freed row below it (take_moves).
  CacheRows,
  // Column = the slot's rows, then the block's new keys (DMC's slot versions,
  // harness/runtime/dmc_attention.h; sim mode's held slots, attention.cpp's
  // held_slot_attention): from start_block(first), a head's slots sit in columns
  // 0 .. slots-1 in slot order and the key of position p at column slots + (p - first).
  // A compression inside the block drops columns and moves none. After the block,
  // columns() says which columns the head keeps, in slot order; DMC moves them to rows
  // 0 .. slots-1 before the next block, sim mode gathers the next block's afresh.
  Versions,
};

// A block's new tokens as the driver hands them to the policy (NewToken), row by row and
// KV head by KV head: the key norms always, the keys, values and queries only for a
// policy whose token_vectors() asks (the caller copies them to the host for that policy alone).
struct BlockTokens {
  BlockTokens(const float* key_norms) : key_norms(key_norms) {}  // norms alone: most policies
  const float* key_norms;         // [rows][n_kv]
  const float* keys = nullptr;    // [rows][n_kv][head_dim], float32, after RoPE as cached
  const float* values = nullptr;  // [rows][n_kv][head_dim], float32
  // [rows][n_kv][group][head_dim], float32, after RoPE: query head h is row h of [rows][n_q]
  // (KV head h / group), as the model's q [t, Hq, d] holds them.
  const float* queries = nullptr;
  int head_dim = 0;
  int group = 1;  // query heads per KV head (with queries)
  // The same block from its row `row` on.
  BlockTokens from_row(int64_t row, int n_kv) const;
  // What KV head kv's policy reads of row r's token.
  NewToken token(int64_t r, int n_kv, int kv) const;
};

// One key (and value) row of a KV head's cache buffer moves from row `from` to row `to`.
struct RowMove {
  int kv_head, from, to;
};

// What a compression rewrote in what one KV head holds (SlotRewrites, with each slot
// turned into its column: the cache row after the compression's row moves, or the
// position). The caller carries it out before the next query attends.
struct RowRewrites {
  int kv_head = 0;
  std::vector<int> key_columns;      // these keys have zeroed_channels set to 0
  std::vector<int> zeroed_channels;  // ascending
  std::vector<int> value_columns;    // value_deltas[i * head_dim ...] adds to value_columns[i]
  std::vector<float> value_deltas;
};

class PolicyDriver {
 public:
  PolicyDriver(const RealisablePolicy& policy, int layer, const SequenceShape& shape, int64_t sliding_window,
               SlotColumns columns);

  // A copy that goes on on its own (a fork of the cache): every head's LayerState cloned.
  // Null when a state cannot be cloned (LayerState::clone). The attended hook is not
  // copied: it belongs to the caller, which sets its own.
  std::unique_ptr<PolicyDriver> clone() const;

  // Queries at positions first .. first+rows-1. logits: [n_q][rows][n] (query head h, row
  // r at (h*rows + r)*n), scaled, a key's logit at its column; each row is overwritten with
  // the attention that weights the values (0 outside the slots it sees). tokens: these
  // queries' own keys (their norms, and the vectors token_vectors() asks for; an
  // internal error when they are missing). visible_out, when not null:
  // [n_kv][rows][n], set to 1 at the columns each query saw and 0 elsewhere. merges, when
  // not null (a DMC model, Versions): [rows][n_kv], 1 where the token's key replaces the
  // head's newest slot (LayerState::merge) instead of entering as a new one; when the
  // policy has already evicted that slot, the key enters as a new one.
  void rows(int64_t first, int64_t rows, int64_t n, float* logits, const BlockTokens& tokens,
            char* visible_out = nullptr, const uint8_t* merges = nullptr);
  void rows(int64_t first, int64_t rows, int64_t n, double* logits, const BlockTokens& tokens,
            char* visible_out = nullptr, const uint8_t* merges = nullptr);

  // The vectors of each new token the policy reads (RealisablePolicy::token_vectors).
  TokenVectors token_vectors() const { return vectors_; }

  // Versions: the block that starts at position `first` begins (see SlotColumns).
  void start_block(int64_t first);

  // CacheRows: the row moves of the evictions since the last call, which the cache must
  // carry out before the next query (then they are forgotten).
  std::vector<RowMove> take_moves();

  // The policy rewrites kept slots (RealisablePolicy::rewrites_slots). A rewrite may only
  // come at the last query of a rows() call (an internal error otherwise), so the caller,
  // which computed the block's logits from what it held, carries it out after the call:
  // after take_moves' row moves, before the next rows() call.
  bool rewrites() const { return rewrites_; }
  // The rewrites since the last call (then they are forgotten).
  std::vector<RowRewrites> take_rewrites();

  // Called for each query and KV head after the query attended and the policy observed
  // it, before the policy compresses: where a quantized cache runs its flush schedule
  // (harness/common/kv_quant.h). It may run on the head's own thread.
  using AttendedHook = std::function<void(int kv_head, int64_t position)>;
  void set_attended_hook(AttendedHook hook) { attended_ = std::move(hook); }

  int n_kv_heads() const { return static_cast<int>(heads_.size()); }
  // The heads hold the same slots (LayerStates::same_slots): they cannot follow DMC's merges.
  bool same_slots() const { return same_slots_; }
  // The heads decide together (LayerStates::lockstep).
  bool lockstep() const { return lockstep_; }
  // CacheRows: the cache row of each slot of a head, in slot order (Positions: the position).
  const std::vector<int>& columns(int kv_head) const { return heads_[kv_head].columns; }
  const LayerState& state(int kv_head) const { return *heads_[kv_head].state; }
  // Slots a head holds now (CacheRows: its rows in use).
  int slots(int kv_head) const { return heads_[kv_head].state->size(); }
  // The most slots a head holds now.
  int max_slots() const;

  // What the cache held over the queries so far, each counted after the query's append
  // and before its compression (while it attends).
  int64_t peak_total_slots() const { return peak_total_slots_; }  // summed over the KV heads
  int peak_head_slots() const { return peak_head_slots_; }         // of any one KV head
  int last_visible() const { return last_visible_; }  // slots the last query saw, most over heads
  // For a policy that rewrites: the key and value elements held (2 x head_dim per slot,
  // the shape's head_dim, less each key channel a rewrite zeroed), summed over the KV
  // heads, at the query where they were most; and the slots held at that query.
  int64_t peak_total_elements() const { return peak_total_elements_; }
  int64_t peak_elements_slots() const { return peak_elements_slots_; }

 private:
  PolicyDriver() = default;
  struct Head {
    std::unique_ptr<LayerState> state;
    std::vector<int> columns;         // [slots]: where each slot's key sits in a logits row
    std::vector<char> pattern;        // [slots]: LayerState::visible's answer
    std::vector<float> observed;      // [group][slots]: what the policy observes
    std::vector<std::vector<double>> exps;  // [group][slots]: scratch of the softmax
    std::vector<int> keep;            // compress's answer
    std::vector<int> row_slots;       // [rows of the block]: slots after each append
    // Its row moves since take_moves; per head, because heads may compress on
    // threads of their own.
    std::vector<RowMove> moves;
    // A policy that rewrites: its rewrites since take_rewrites, and per slot the key
    // channels zeroed (their sum in zeroed_total; row_zeroed: that sum after each append).
    std::vector<RowRewrites> rewrites;
    SlotRewrites slot_rewrites;  // scratch
    std::vector<int> zeroed;
    int64_t zeroed_total = 0;
    std::vector<int64_t> row_zeroed;
    int observation_window = 0;       // LayerState::observation_window
    int visible = 0;                  // slots its latest query saw
    const char* vis = nullptr;        // the latest query's pattern (null: no pattern)
    int64_t oldest = 0;               // the oldest position the latest query sees
    int block_base = 0;               // Versions: the slots at the block's start
  };
  template <typename Scalar>
  void drive(int64_t first, int64_t rows, int64_t n, Scalar* logits, const BlockTokens& tokens, char* visible_out,
             const uint8_t* merges);
  // The key of `position` enters the head: appended, or merged into the newest slot.
  void append(Head& head, int64_t position, const NewToken& token, bool merge);
  // What the query at `position` sees; sizes the scratch.
  void see(Head& head, int64_t position);
  // The attention of query head `member` of the group, row r of the block; returns the
  // slots it saw.
  template <typename Scalar>
  int attend(Head& head, int kv, int member, int64_t r, int64_t rows, int64_t n, Scalar* logits);
  void record_visible(const Head& head, int kv, int64_t r, int64_t rows, int64_t n, char* visible_out) const;
  void compress(Head& head, int kv, int64_t position);
  // The query at `position` hands the head its attention, or only counts when no
  // compression will read it (LayerState::observation_window).
  void observe(Head& head, int64_t position);
  // Takes the state's rewrites after its compression at `position`.
  void take_state_rewrites(Head& head, int kv, int64_t position);
  // The query at `position` is the last of a block of the prefill (prefill_block_).
  bool ends_prefill_block(int64_t position) const {
    return prefill_block_ > 0 && (position + 1) % prefill_block_ == 0;
  }

  int group_ = 1;
  int prefill_len_ = 0;
  int prefill_block_ = 0;  // RealisablePolicy::prefill_block
  TokenVectors vectors_ = TokenVectors::None;
  int head_dim_ = 0;
  int64_t window_ = 0;
  SlotColumns columns_;
  bool lockstep_ = false;
  bool same_slots_ = false;
  int64_t block_first_ = 0;  // Versions: the block's first position
  bool rewrites_ = false;    // RealisablePolicy::rewrites_slots
  int64_t block_last_ = -1;  // the last position of the current rows() call
  int64_t peak_total_elements_ = 0, peak_elements_slots_ = 0;
  std::vector<Head> heads_;
  AttendedHook attended_;
  int64_t peak_total_slots_ = 0;
  int peak_head_slots_ = 0;
  int last_visible_ = 0;
};

}  // namespace kvevict
