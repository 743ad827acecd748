#include "harness/runtime/policy_driver.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "harness/common/errors.h"

#include "harness/runtime/slot_softmax.h"

namespace kvevict {
namespace {

// Below this many logits in a block, the heads stay on the calling thread: a parallel
// region costs more than they do.
constexpr int64_t kParallelLogits = 4096;

}  // namespace

BlockTokens BlockTokens::from_row(int64_t row, int n_kv) const {
  BlockTokens rest = *this;
  rest.key_norms += row * n_kv;
  if (keys) rest.keys += row * n_kv * head_dim;
  if (values) rest.values += row * n_kv * head_dim;
  if (queries) rest.queries += row * n_kv * group * head_dim;
  return rest;
}

NewToken BlockTokens::token(int64_t r, int n_kv, int kv) const {
  const int64_t at = r * n_kv + kv;
  NewToken token;
  token.key_norm = key_norms[at];
  if (keys) token.key = keys + at * head_dim;
  if (values) token.value = values + at * head_dim;
  if (queries) token.queries = queries + at * group * head_dim;
  return token;
}

PolicyDriver::PolicyDriver(const RealisablePolicy& policy, int layer, const SequenceShape& shape,
                           int64_t sliding_window, SlotColumns columns)
    : group_(shape.group()), prefill_len_(shape.prefill_len), prefill_block_(policy.prefill_block()),
      vectors_(policy.token_vectors()),
      head_dim_(shape.head_dim), window_(sliding_window), columns_(columns), rewrites_(policy.rewrites_slots()) {
  if (rewrites_ && columns == SlotColumns::Versions)
    throw Error("policy " + policy.name() + " rewrites the keys or values of kept slots; over DMC's merged slots "
                "that is not implemented");
  LayerStates states = policy.make_layer_states(layer, shape);
  lockstep_ = states.lockstep;
  same_slots_ = states.same_slots;
  heads_.resize(states.heads.size());
  for (size_t h = 0; h < heads_.size(); ++h) {
    heads_[h].state = std::move(states.heads[h]);
    heads_[h].observation_window = heads_[h].state->observation_window();
    heads_[h].exps.resize(group_);
  }
}

std::unique_ptr<PolicyDriver> PolicyDriver::clone() const {
  std::unique_ptr<PolicyDriver> copy(new PolicyDriver());
  copy->group_ = group_;
  copy->prefill_len_ = prefill_len_;
  copy->prefill_block_ = prefill_block_;
  copy->vectors_ = vectors_;
  copy->head_dim_ = head_dim_;
  copy->window_ = window_;
  copy->columns_ = columns_;
  copy->lockstep_ = lockstep_;
  copy->same_slots_ = same_slots_;
  copy->block_first_ = block_first_;
  copy->rewrites_ = rewrites_;
  copy->block_last_ = block_last_;
  copy->peak_total_elements_ = peak_total_elements_;
  copy->peak_elements_slots_ = peak_elements_slots_;
  copy->peak_total_slots_ = peak_total_slots_;
  copy->peak_head_slots_ = peak_head_slots_;
  copy->last_visible_ = last_visible_;
  LayerStateCopies shared;  // the layer's heads share these, so one copy for all of them
  copy->heads_.resize(heads_.size());
  for (size_t h = 0; h < heads_.size(); ++h) {
    const Head& from = heads_[h];
    Head& to = copy->heads_[h];
    to.state = from.state->clone(shared);
    if (!to.state) return nullptr;
    to.columns = from.columns;
    to.pattern = from.pattern;
    to.observed = from.observed;
    to.exps = from.exps;
    to.keep = from.keep;
    to.row_slots = from.row_slots;
    to.moves = from.moves;
    to.rewrites = from.rewrites;
    to.zeroed = from.zeroed;
    to.zeroed_total = from.zeroed_total;
    to.row_zeroed = from.row_zeroed;
    to.observation_window = from.observation_window;
    to.visible = from.visible;
    to.vis = from.vis ? to.pattern.data() : nullptr;
    to.oldest = from.oldest;
    to.block_base = from.block_base;
  }
  return copy;
}

void PolicyDriver::rows(int64_t first, int64_t rows, int64_t n, float* logits, const BlockTokens& tokens,
                        char* visible_out, const uint8_t* merges) {
  drive(first, rows, n, logits, tokens, visible_out, merges);
}

void PolicyDriver::rows(int64_t first, int64_t rows, int64_t n, double* logits, const BlockTokens& tokens,
                        char* visible_out, const uint8_t* merges) {
  drive(first, rows, n, logits, tokens, visible_out, merges);
}

void PolicyDriver::start_block(int64_t first) {
  block_first_ = first;
  for (Head& head : heads_) {
    head.block_base = head.state->size();
    head.columns.resize(head.block_base);
    std::iota(head.columns.begin(), head.columns.end(), 0);
  }
}

std::vector<RowMove> PolicyDriver::take_moves() {
  std::vector<RowMove> moves;
  for (Head& head : heads_) {
    moves.insert(moves.end(), head.moves.begin(), head.moves.end());
    head.moves.clear();
  }
  return moves;
}

std::vector<RowRewrites> PolicyDriver::take_rewrites() {
  std::vector<RowRewrites> rewrites;
  for (Head& head : heads_) {
    for (RowRewrites& r : head.rewrites) rewrites.push_back(std::move(r));
    head.rewrites.clear();
  }
  return rewrites;
}

int PolicyDriver::max_slots() const {
  int most = 0;
  for (const Head& head : heads_) most = std::max(most, head.state->size());
  return most;
}

void PolicyDriver::append(Head& head, int64_t position, const NewToken& token, bool merge) {
  int column = static_cast<int>(head.columns.size());
  if (columns_ == SlotColumns::Positions) column = static_cast<int>(position);
  if (columns_ == SlotColumns::Versions) column = head.block_base + static_cast<int>(position - block_first_);
  const std::vector<int>& positions = head.state->positions();
  if (merge && !positions.empty() && positions.back() == position - 1) {
    head.state->merge(static_cast<int>(position), token);
    head.columns.back() = column;
    return;
  }
  head.state->append(static_cast<int>(position), token);
  head.columns.push_back(column);
  if (rewrites_) head.zeroed.push_back(0);
}

void PolicyDriver::see(Head& head, int64_t position) {
  head.oldest = window_ > 0 ? position - window_ + 1 : std::numeric_limits<int64_t>::min();
  head.vis = head.state->visible(static_cast<int>(position), &head.pattern) ? head.pattern.data() : nullptr;
  const size_t slots = static_cast<size_t>(head.state->size());
  head.observed.resize(group_ * slots);
  for (auto& scratch : head.exps) scratch.resize(slots);
}

template <typename Scalar>
int PolicyDriver::attend(Head& head, int kv, int member, int64_t r, int64_t rows, int64_t n, Scalar* logits) {
  const int slots = head.state->size();
  const int64_t h = static_cast<int64_t>(kv) * group_ + member;
  SlotRow at;
  at.positions = head.state->positions().data();
  at.columns = head.columns.data();
  at.slots = slots;
  at.oldest = head.oldest;
  at.vis = head.vis;
  return slot_softmax(logits + (h * rows + r) * n, n, at, head.exps[member].data(),
                      head.observed.data() + static_cast<size_t>(member) * slots);
}

void PolicyDriver::record_visible(const Head& head, int kv, int64_t r, int64_t rows, int64_t n,
                                  char* visible_out) const {
  if (!visible_out) return;
  char* out = visible_out + (static_cast<int64_t>(kv) * rows + r) * n;
  std::fill(out, out + n, 0);
  const std::vector<int>& positions = head.state->positions();
  for (int s = 0; s < head.state->size(); ++s)
    out[head.columns[s]] = positions[s] >= head.oldest && (!head.vis || head.vis[s]);
}

void PolicyDriver::observe(Head& head, int64_t position) {
  const int window = head.observation_window;
  // The next compression: at the end of the prefill or of the policy's prefill block;
  // after the prefill, at every query.
  if (window > 0 && position < prefill_len_ - 1) {
    int64_t next = prefill_len_ - 1;
    if (prefill_block_ > 0) next = std::min<int64_t>(next, (position / prefill_block_ + 1) * prefill_block_ - 1);
    if (position <= next - window) {
      head.state->skip_observation();
      return;
    }
  }
  head.state->observe(head.observed.data());
}

void PolicyDriver::compress(Head& head, int kv, int64_t position) {
  if (position < prefill_len_ - 1 && !ends_prefill_block(position)) return;
  const bool evicted = head.state->compress(&head.keep);
  if (evicted && rewrites_) {
    std::vector<int> zeroed(head.keep.size());
    head.zeroed_total = 0;
    for (size_t k = 0; k < head.keep.size(); ++k) head.zeroed_total += zeroed[k] = head.zeroed[head.keep[k]];
    head.zeroed.swap(zeroed);
  }
  if (evicted) {
    const std::vector<int>& keep = head.keep;
    std::vector<int> kept(keep.size());
    for (size_t k = 0; k < keep.size(); ++k) kept[k] = head.columns[keep[k]];
    if (columns_ == SlotColumns::CacheRows) {
      // Rows below the kept count that stay are left alone; each kept row at or above it
      // moves into the lowest free row below it: one row copy per eviction, not a rewrite.
      const int count = static_cast<int>(kept.size());
      std::vector<char> used(count, 0);
      for (int row : kept)
        if (row < count) used[row] = 1;
      int free_row = 0;
      for (int& row : kept) {
        if (row < count) continue;
        while (used[free_row]) ++free_row;
        used[free_row] = 1;
        head.moves.push_back({kv, row, free_row});
        row = free_row;
      }
    }
    head.columns.swap(kept);
  }
  if (rewrites_) take_state_rewrites(head, kv, position);
}

void PolicyDriver::take_state_rewrites(Head& head, int kv, int64_t position) {
  SlotRewrites& slots = head.slot_rewrites;
  slots.clear();
  if (!head.state->take_rewrites(&slots) || slots.empty()) return;
  // The caller computed this block's logits from what it held at the block's start, so a
  // rewrite inside the block would reach the block's later queries too late.
  if (position != block_last_)
    throw Error("internal: a policy rewrote kept slots at position " + std::to_string(position) +
                ", inside a block of queries that ends at " + std::to_string(block_last_));
  const int n = head.state->size(), channels = static_cast<int>(slots.zeroed_channels.size());
  auto column = [&](int slot) {
    if (slot < 0 || slot >= n) throw Error("internal: a rewrite names slot " + std::to_string(slot) + " of " + std::to_string(n));
    return head.columns[slot];
  };
  RowRewrites rows;
  rows.kv_head = kv;
  rows.zeroed_channels = slots.zeroed_channels;
  for (int slot : slots.key_slots) {
    rows.key_columns.push_back(column(slot));
    // A slot pruned twice counts the larger set of zeroed channels.
    if (channels > head.zeroed[slot]) {
      head.zeroed_total += channels - head.zeroed[slot];
      head.zeroed[slot] = channels;
    }
  }
  for (int slot : slots.value_slots) rows.value_columns.push_back(column(slot));
  rows.value_deltas = std::move(slots.value_deltas);
  head.rewrites.push_back(std::move(rows));
}

template <typename Scalar>
void PolicyDriver::drive(int64_t first, int64_t rows, int64_t n, Scalar* logits, const BlockTokens& tokens,
                         char* visible_out, const uint8_t* merges) {
  const int n_kv = static_cast<int>(heads_.size());
  if (merges && columns_ != SlotColumns::Versions) throw Error("the policy driver merges slots only over Versions columns");
  const bool needs_keys = vectors_ != TokenVectors::None, needs_values = vectors_ >= TokenVectors::KeysAndValues,
             needs_queries = vectors_ == TokenVectors::KeysValuesAndQueries;
  if ((needs_keys && (!tokens.keys || tokens.head_dim != head_dim_)) || (needs_values && !tokens.values) ||
      (needs_queries && (!tokens.queries || tokens.group != group_)))
    throw Error("internal: the policy reads each new token's key" +
                std::string(needs_queries ? ", value and query" : needs_values ? " and value" : "") +
                " vectors of head_dim " + std::to_string(head_dim_) + ", which its caller did not give");
  // A block of cache rows holds still while its logits are read: a compression may end it,
  // never fall inside it (the caller cuts the prefill where the policy's blocks end).
  if (columns_ == SlotColumns::CacheRows)
    for (int64_t r = 0; r + 1 < rows; ++r)
      if (first + r < prefill_len_ - 1 && ends_prefill_block(first + r))
        throw Error("internal: a block of the prefill runs past position " + std::to_string(first + r) +
                    ", where the policy compresses (prefill_block " + std::to_string(prefill_block_) + ")");
  block_last_ = first + rows - 1;
  for (Head& head : heads_) {
    head.row_slots.assign(rows, 0);
    if (rewrites_) head.row_zeroed.assign(rows, 0);
  }
  auto merged = [&](int64_t r, int64_t kv) { return merges && merges[r * n_kv + kv]; };
  const bool parallel = rows * n * n_kv * group_ >= kParallelLogits;
  if (!lockstep_) {
    // No head reads another's state: each takes the whole block on its own thread.
    at::parallel_for(0, n_kv, parallel ? 1 : n_kv, [&](int64_t begin, int64_t end) {
      for (int64_t kv = begin; kv < end; ++kv) {
        Head& head = heads_[kv];
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t position = first + r;
          append(head, position, tokens.token(r, n_kv, static_cast<int>(kv)), merged(r, kv));
          head.row_slots[r] = head.state->size();
          if (rewrites_) head.row_zeroed[r] = head.zeroed_total;
          see(head, position);
          for (int j = 0; j < group_; ++j) head.visible = attend(head, static_cast<int>(kv), j, r, rows, n, logits);
          record_visible(head, static_cast<int>(kv), r, rows, n, visible_out);
          observe(head, position);
          if (attended_) attended_(static_cast<int>(kv), position);
          compress(head, static_cast<int>(kv), position);
        }
      }
    });
  } else {
    // One decision for the layer: every head takes each step before any takes the next.
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t position = first + r;
      for (int kv = 0; kv < n_kv; ++kv) {
        append(heads_[kv], position, tokens.token(r, n_kv, kv), merged(r, kv));
        heads_[kv].row_slots[r] = heads_[kv].state->size();
        if (rewrites_) heads_[kv].row_zeroed[r] = heads_[kv].zeroed_total;
        see(heads_[kv], position);
      }
      // The query heads' softmaxes are independent: they share the threads.
      const int64_t n_q = static_cast<int64_t>(n_kv) * group_;
      at::parallel_for(0, n_q, n_q * heads_[0].state->size() * 4 >= kParallelLogits ? 1 : n_q,
                       [&](int64_t begin, int64_t end) {
                         for (int64_t h = begin; h < end; ++h) {
                           const int kv = static_cast<int>(h / group_), j = static_cast<int>(h % group_);
                           const int seen = attend(heads_[kv], kv, j, r, rows, n, logits);
                           if (j == 0) heads_[kv].visible = seen;
                         }
                       });
      for (int kv = 0; kv < n_kv; ++kv) {
        record_visible(heads_[kv], kv, r, rows, n, visible_out);
        observe(heads_[kv], position);
        if (attended_) attended_(kv, position);
      }
      for (int kv = 0; kv < n_kv; ++kv) compress(heads_[kv], kv, position);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    int64_t total = 0;
    for (const Head& head : heads_) {
      total += head.row_slots[r];
      peak_head_slots_ = std::max(peak_head_slots_, head.row_slots[r]);
    }
    peak_total_slots_ = std::max(peak_total_slots_, total);
    if (rewrites_) {
      int64_t elements = 2 * static_cast<int64_t>(head_dim_) * total;
      for (const Head& head : heads_) elements -= head.row_zeroed[r];
      if (elements > peak_total_elements_) {
        peak_total_elements_ = elements;
        peak_elements_slots_ = total;
      }
    }
  }
  last_visible_ = 0;
  for (const Head& head : heads_) last_visible_ = std::max(last_visible_, head.visible);
}

}  // namespace kvevict
