// Acceptance (specbeam/search/accept.py) in C++, for passes without step processors:
// fairseq2's scoring of the rows a step reads, the replay of its beam search over the
// verified tree (relaxed as relax.py relaxes it, where asked), and the hypotheses' new
// tokens and scores. The
// vocabulary-wide ops are the ATen calls of the Python path on rows of the same shapes
// (so the same log-probs and the same top-2k, ties included); the bookkeeping on
// (S, k) arrays, ~150 numpy calls a pass at beam 5 and γ 2, becomes loops over a few
// dozen numbers.
#include "native.h"

#include <algorithm>
#include <limits>

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// ScoringRules: eos, pad and unk ids (-1: none), min and max sequence length, and
// the UNK penalty and temperature.
struct Rules {
  int64_t eos, pad, unk, min_seq_len, max_seq_len;
  double unk_penalty, temperature;

  // ScoringRules.log_probs and .apply on rows (N, V) at sequence indices step_nr (N,).
  Tensor scored(Tensor logits, const std::vector<int64_t>& step_nr) const {
    if (temperature != 1.0) logits = logits / temperature;
    Tensor lprobs = at::log_softmax(logits, -1, at::kFloat);
    const int64_t vocab = lprobs.size(1);
    float* p = lprobs.data_ptr<float>();
    for (size_t r = 0; r < step_nr.size(); ++r, p += vocab) {
      const bool forced = step_nr[r] == max_seq_len - 1;
      if (forced) {
        const float e = p[eos];
        std::fill(p, p + vocab, -kInf);
        p[eos] = e;
        continue;
      }
      if (unk >= 0) p[unk] = p[unk] - static_cast<float>(unk_penalty);
      if (pad >= 0) p[pad] = -kInf;
      if (step_nr[r] < min_seq_len - 1) p[eos] = -kInf;
    }
    return lprobs;
  }
};

// Relaxed acceptance's tolerance (relax.py's Relaxation; top 0: exact).
struct Relaxation {
  int64_t top;
  float gap;

  // The `top`-th best and the best of a row of log-probs (top ≥ 1), as topk's values.
  std::pair<float, float> bounds(const float* row, int64_t vocab) const {
    const int64_t m = std::min(top, vocab);
    std::vector<float> best(m, -kInf);  // descending
    int64_t seen = 0;
    for (int64_t t = 0; t < vocab; ++t) {
      const float x = row[t];
      if (seen >= m && !(x > best[m - 1])) continue;
      int64_t at = std::min(seen, m - 1);
      while (at > 0 && best[at - 1] < x) {
        best[at] = best[at - 1];
        --at;
      }
      best[at] = x;
      seen = std::min(seen + 1, m);
    }
    return {best[m - 1], best[0]};
  }
};

// One replay step's choice for one source: k (parent, token, score, parent's deepest
// verified row), as _Replay.add keeps them.
struct Choice {
  std::vector<int64_t> parent, token, parent_last;
  std::vector<float> score;
};

}  // namespace

// logits (S, T, V); root_slots (S, n); the tree's node_slots, tokens, parents, valid
// (S, D, w); positions (S, T); the live hypotheses' scores (S, n), tokens and cumulative
// scores (S, k, L) and next sequence index step_nr (S,); finished (S,): hypotheses each
// source has finished so far; ints: Rules' five, then the relaxation's top (0: exact);
// doubles: Rules' two, then its gap. Returns seqs, step_scores (S, k, L), scores, origin, node,
// roots (S, k), steps, accepted, done (S,), then the hypotheses finished in output order:
// their sources, EOS indices (E,), tokens and cumulative scores (E, L), scores (E,).
std::vector<Tensor> accept(const Tensor& logits_in, const Tensor& root_slots,
                           const Tensor& node_slots, const Tensor& tokens_in,
                           const Tensor& parents_in, const Tensor& valid_in,
                           const Tensor& positions, const Tensor& scores_in, const Tensor& seqs,
                           const Tensor& step_scores, const Tensor& step_nr_in,
                           const Tensor& finished, int64_t k, const std::vector<int64_t>& ints,
                           const std::vector<double>& doubles, bool bounded) {
  const Rules rules{ints[0], ints[1], ints[2], ints[3], ints[4], doubles[0], doubles[1]};
  const Relaxation relax{ints[5], static_cast<float>(doubles[2])};
  const int64_t num_sources = root_slots.size(0), n = root_slots.size(1);
  const int64_t depth = tokens_in.size(1), width = tokens_in.size(2);
  const int64_t num_slots = logits_in.size(1), vocab = logits_in.size(2);
  const int64_t length = seqs.size(2);
  const Tensor logits = logits_in.contiguous().view({num_sources * num_slots, vocab});
  const auto roots_of = root_slots.accessor<int64_t, 2>();
  const auto node_slot = node_slots.accessor<int64_t, 3>();
  const auto tokens = tokens_in.accessor<int64_t, 3>();
  const auto parents = parents_in.accessor<int64_t, 3>();
  const auto valid = valid_in.accessor<bool, 3>();
  const auto position = positions.accessor<int64_t, 2>();
  const auto step_nr = step_nr_in.accessor<int64_t, 1>();
  const auto done_before = finished.accessor<int64_t, 1>();

  // Row r of the replay: live hypothesis r < n, else tree node r - n = d·w + b.
  auto slot_of = [&](int64_t s, int64_t r) {
    return r < n ? roots_of[s][r] : node_slot[s][(r - n) / width][(r - n) % width];
  };
  // The row of the valid node below row `parent` with token `token` (the first, if
  // several), or -1.
  auto child_of = [&](int64_t s, int64_t parent, int64_t token) -> int64_t {
    const int64_t d = parent < n ? 0 : (parent - n) / width + 1;
    const int64_t up = parent < n ? parent : (parent - n) % width;
    if (d >= depth) return -1;
    for (int64_t b = 0; b < width; ++b) {
      if (valid[s][d][b] && parents[s][d][b] == up && tokens[s][d][b] == token) {
        return n + d * width + b;
      }
    }
    return -1;
  };

  int64_t h = n;
  std::vector<int64_t> row(num_sources * h), last;  // -1: off the tree
  const Tensor scores_c = scores_in.contiguous();
  std::vector<float> score(scores_c.data_ptr<float>(), scores_c.data_ptr<float>() + scores_c.numel());

  // relax.py's relaxed_step for source s at step j over its h current hypotheses, whose
  // log-probs (h, V) are `lp`: the k best drafted children of level j (by target score)
  // within the target's top `relax.top` and `relax.gap` of its best for their parent. True
  // if k exist; then they replace parent, token, top_k and child.
  std::vector<float> beta_last(h), beta_best(h);
  std::vector<char> beta_known(h);
  std::vector<std::pair<float, int64_t>> good;
  auto relaxed = [&](int64_t s, int64_t j, int64_t h, const float* lp,
                     std::vector<int64_t>& parent, std::vector<int64_t>& token,
                     std::vector<float>& top_k, std::vector<int64_t>& child) {
    beta_last.assign(h, 0.0f);
    beta_best.assign(h, 0.0f);
    beta_known.assign(h, 0);
    good.clear();
    for (int64_t b = 0; b < width; ++b) {
      if (!valid[s][j][b]) continue;
      // The first current hypothesis whose row is this node's parent (level j's id).
      int64_t hyp = -1;
      for (int64_t i = 0; i < h && hyp < 0; ++i) {
        const int64_t r = row[s * h + i];
        const int64_t id = r < 0 ? -1 : (j == 0 ? r : r - n - (j - 1) * width);
        if (id == parents[s][j][b]) hyp = i;
      }
      if (hyp < 0) continue;
      const float* own = lp + hyp * vocab;
      if (!beta_known[hyp]) {
        const auto [last, best] = relax.bounds(own, vocab);
        beta_last[hyp] = last;
        beta_best[hyp] = best;
        beta_known[hyp] = 1;
      }
      const float l = own[tokens[s][j][b]];
      if (!(l >= beta_last[hyp] && l >= beta_best[hyp] - relax.gap)) continue;
      const float cum = score[s * h + hyp] + l;
      if (cum > -kInf) good.emplace_back(cum, b);
    }
    if (static_cast<int64_t>(good.size()) < k) return false;
    // Best first; equal scores in level order (relax.py sorts stably).
    std::stable_sort(good.begin(), good.end(),
                     [](const auto& x, const auto& y) { return x.first > y.first; });
    for (int64_t i = 0; i < k; ++i) {
      const int64_t b = good[i].second;
      const int64_t p = parents[s][j][b];
      for (int64_t q = 0; q < h; ++q) {
        const int64_t r = row[s * h + q];
        if (r >= 0 && (j == 0 ? r : r - n - (j - 1) * width) == p) {
          parent[i] = q;
          break;
        }
      }
      token[i] = tokens[s][j][b];
      top_k[i] = good[i].first;
      child[i] = n + j * width + b;
    }
    return true;
  };
  for (int64_t s = 0; s < num_sources; ++s) {
    for (int64_t i = 0; i < h; ++i) row[s * h + i] = i;
  }
  last = row;
  std::vector<int64_t> count(done_before.data(), done_before.data() + num_sources);
  std::vector<char> active(num_sources, 1), done(num_sources, 0);
  std::vector<int64_t> accepted(num_sources, 0), steps(num_sources, 0);
  std::vector<Choice> choices;  // per step, (S·k) each
  std::vector<int64_t> event_step, event_source, event_hyp;
  std::vector<float> event_score;

  for (int64_t j = 0; j <= depth; ++j) {
    Tensor at_slot = at::empty({num_sources * h}, root_slots.options());
    Tensor base = at::empty({num_sources, h}, scores_in.options());
    int64_t* at = at_slot.data_ptr<int64_t>();
    float* b = base.data_ptr<float>();
    std::vector<int64_t> row_step(num_sources * h);
    for (int64_t s = 0; s < num_sources; ++s) {
      for (int64_t i = 0; i < h; ++i) {
        const int64_t r = row[s * h + i];
        const int64_t slot = slot_of(s, std::max<int64_t>(r, 0));  // r -1 reads some row
        at[s * h + i] = s * num_slots + slot;
        row_step[s * h + i] = position[s][slot] + 1;
        b[s * h + i] = r < 0 ? -kInf : score[s * h + i];  // off the tree: no candidates
      }
    }
    Tensor lprobs = rules.scored(logits.index_select(0, at_slot), row_step);
    const int64_t m = std::min<int64_t>(2 * k, h * vocab);
    TORCH_CHECK(m >= k, "fewer candidates than the beam");
    // Each source's top m of base + lprobs (k·V candidates): topk's, found by one scan
    // where no tie makes the order topk's own (csrc/top.cpp).
    std::vector<float> top_v(num_sources * m);
    std::vector<int64_t> index_v(num_sources * m);
    const float* lp_all = lprobs.data_ptr<float>();
    for (int64_t s = 0; s < num_sources; ++s) {
      if (top_distinct(b + s * h, lp_all + s * h * vocab, h, vocab, m, &top_v[s * m],
                       &index_v[s * m]))
        continue;
      Tensor cand = (base[s].unsqueeze(-1) + lprobs.view({num_sources, h, vocab})[s]).flatten();
      auto ranked = cand.topk(m);
      const Tensor top_t = std::get<0>(ranked).contiguous();
      const Tensor index_t = std::get<1>(ranked).contiguous();
      std::copy_n(top_t.data_ptr<float>(), m, &top_v[s * m]);
      std::copy_n(index_t.data_ptr<int64_t>(), m, &index_v[s * m]);
    }
    const float* top = top_v.data();
    const int64_t* index = index_v.data();

    Choice choice{std::vector<int64_t>(num_sources * k), std::vector<int64_t>(num_sources * k),
                  std::vector<int64_t>(num_sources * k), std::vector<float>(num_sources * k)};
    std::vector<int64_t> next_row(num_sources * k), next_last(num_sources * k);
    std::vector<int64_t> keep(k), child(k), parent(k), token(k);
    std::vector<float> top_k(k);
    const float* lp_rows = lprobs.data_ptr<float>();
    for (int64_t s = 0; s < num_sources; ++s) {
      const float* top_s = top + s * m;
      const int64_t* index_s = index + s * m;
      // The first k non-EOS ranks, then EOS ones (numpy's stable argsort of is_eos).
      int64_t kept = 0;
      for (int eos_pass = 0; eos_pass < 2 && kept < k; ++eos_pass) {
        for (int64_t r = 0; r < m && kept < k; ++r) {
          if ((index_s[r] % vocab == rules.eos) == (eos_pass == 1)) keep[kept++] = r;
        }
      }
      // Off-tree hypotheses' children score at most their parent: out of reach if below
      // the k-th non-EOS candidate.
      float reach = -kInf;
      bool any_off = false;
      for (int64_t i = 0; i < h; ++i) {
        if (row[s * h + i] < 0) {
          any_off = true;
          reach = std::max(reach, score[s * h + i]);
        }
      }
      if (any_off && !(reach < top_s[keep[k - 1]])) active[s] = 0;
      const bool was_active = active[s];
      if (was_active) {
        for (int64_t r = 0; r < std::min(k, m); ++r) {
          if (index_s[r] % vocab != rules.eos || done[s]) continue;
          event_step.push_back(j);
          event_source.push_back(s);
          event_hyp.push_back(index_s[r] / vocab);
          event_score.push_back(top_s[r]);
          if (++count[s] == k) done[s] = 1;
        }
      }
      bool all_in = true, any_in = false;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t idx = index_s[keep[i]], parent_row = row[s * h + idx / vocab];
        parent[i] = idx / vocab;
        token[i] = idx % vocab;
        top_k[i] = top_s[keep[i]];
        child[i] = parent_row >= 0 ? child_of(s, parent_row, token[i]) : -1;
        all_in &= child[i] >= 0;
        any_in |= child[i] >= 0;
      }
      if (relax.top > 0 && j < depth && width >= k && !all_in &&
          relaxed(s, j, h, lp_rows + s * h * vocab, parent, token, top_k, child)) {
        all_in = any_in = true;
      }
      const bool go_on = (all_in || (bounded && any_in)) && was_active && !done[s];
      for (int64_t i = 0; i < k; ++i) {
        const int64_t at_i = s * k + i;
        const bool take = go_on && child[i] >= 0;
        choice.parent[at_i] = parent[i];
        choice.token[at_i] = token[i];
        choice.score[at_i] = top_k[i];
        choice.parent_last[at_i] = last[s * h + parent[i]];
        accepted[s] += take;
        next_last[at_i] = take ? child[i] : choice.parent_last[at_i];
        next_row[at_i] = take ? child[i] : -1;
      }
      steps[s] += was_active;
      active[s] = go_on;
    }
    row.swap(next_row);
    last.swap(next_last);
    score = choice.score;
    choices.push_back(std::move(choice));
    h = k;
    if (std::none_of(active.begin(), active.end(), [](char a) { return a; })) break;
  }

  // _Replay.prefixes: hypothesis `hyp` after `taken` steps of source s is its origin's
  // tokens and scores with one position written per step; returns the origin.
  const Tensor seqs_c = seqs.contiguous(), step_scores_c = step_scores.contiguous();
  const int64_t* old_seq = seqs_c.data_ptr<int64_t>();
  const float* old_score = step_scores_c.data_ptr<float>();
  auto rebuild = [&](int64_t s, int64_t hyp, int64_t taken, int64_t* seq_out, float* score_out) {
    std::vector<int64_t> path(taken);
    for (int64_t j = taken - 1; j >= 0; --j) {
      path[j] = hyp;
      hyp = choices[j].parent[s * k + hyp];
    }
    const int64_t from = (s * seqs.size(1) + hyp) * length;
    std::copy(old_seq + from, old_seq + from + length, seq_out);
    std::copy(old_score + from, old_score + from + length, score_out);
    for (int64_t j = 0; j < taken; ++j) {
      const int64_t at = std::min(step_nr[s] + j, length - 1);
      seq_out[at] = choices[j].token[s * k + path[j]];
      score_out[at] = choices[j].score[s * k + path[j]];
    }
    return hyp;
  };

  const auto long_opts = root_slots.options();
  Tensor new_seqs = at::empty({num_sources, k, length}, long_opts);
  Tensor new_step_scores = at::empty({num_sources, k, length}, scores_in.options());
  Tensor new_scores = at::empty({num_sources, k}, scores_in.options());
  Tensor origin = at::empty({num_sources, k}, long_opts), node = at::empty_like(origin);
  Tensor roots = at::empty_like(origin);
  for (int64_t s = 0; s < num_sources; ++s) {
    const Choice& final_step = choices[steps[s] - 1];
    for (int64_t i = 0; i < k; ++i) {
      const int64_t at_i = s * k + i;
      origin.data_ptr<int64_t>()[at_i] =
          rebuild(s, i, steps[s], new_seqs.data_ptr<int64_t>() + at_i * length,
                  new_step_scores.data_ptr<float>() + at_i * length);
      node.data_ptr<int64_t>()[at_i] = std::max<int64_t>(final_step.parent_last[at_i] - n, -1);
      roots.data_ptr<int64_t>()[at_i] = final_step.token[at_i];
      new_scores.data_ptr<float>()[at_i] = final_step.score[at_i];
    }
  }
  // A finished hypothesis: its parent's prefix before the step, then EOS at step_nr + j.
  const int64_t num_events = static_cast<int64_t>(event_step.size());
  Tensor event_seqs = at::empty({num_events, length}, long_opts);
  Tensor event_step_scores = at::empty({num_events, length}, scores_in.options());
  Tensor event_sources = at::empty({num_events}, long_opts), event_at = at::empty_like(event_sources);
  for (int64_t e = 0; e < num_events; ++e) {
    const int64_t s = event_source[e];
    rebuild(s, event_hyp[e], event_step[e], event_seqs.data_ptr<int64_t>() + e * length,
            event_step_scores.data_ptr<float>() + e * length);
    event_sources.data_ptr<int64_t>()[e] = s;
    event_at.data_ptr<int64_t>()[e] = step_nr[s] + event_step[e];
  }
  auto longs = [&](const std::vector<int64_t>& v) { return at::tensor(v, long_opts); };
  Tensor done_t = at::tensor(std::vector<uint8_t>(done.begin(), done.end()), at::kByte);
  return {new_seqs, new_step_scores, new_scores, origin, node, roots, longs(steps),
          longs(accepted), done_t.to(at::kBool), event_sources, event_at, event_seqs,
          event_step_scores, at::tensor(event_score, scores_in.options())};
}
