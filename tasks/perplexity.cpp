// Perplexity over a text: the harness tokenises and scores it; the task only names the
// metrics it reports (mean negative log-likelihood per token, and its exponential).
#include <memory>

#include "tasks/task.h"

namespace kvevict {
namespace {

class PerplexityTask : public Task {
 public:
  std::string name() const override { return "perplexity"; }
  TaskKind kind() const override { return TaskKind::Perplexity; }
  std::vector<std::string> metric_names() const override { return {"mean_nll", "ppl"}; }
};

}  // namespace

std::unique_ptr<Task> make_perplexity_task() { return std::make_unique<PerplexityTask>(); }

}  // namespace kvevict
