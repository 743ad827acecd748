// Maps task names to tasks. A new task is one file in tasks/ plus one line here.
#include <functional>
#include <memory>
#include <utility>

#include "harness/common/errors.h"
#include "tasks/task.h"

namespace kvevict {

// Each defined in tasks/<name>.cpp.
std::unique_ptr<Task> make_copa_task();
std::unique_ptr<Task> make_piqa_task();
std::unique_ptr<Task> make_winogrande_task();
std::unique_ptr<Task> make_openbookqa_task();
std::unique_ptr<Task> make_rte_task();
std::unique_ptr<Task> make_mathqa_task();
std::unique_ptr<Task> make_mathqa_cot_task();
std::unique_ptr<Task> make_xsum_task();
std::unique_ptr<Task> make_cnndm_task();
std::unique_ptr<Task> make_perplexity_task();
std::unique_ptr<Task> make_ruler_niah_single_1_task();  // the ruler_niah_* in tasks/ruler_niah.cpp
std::unique_ptr<Task> make_ruler_niah_single_2_task();
std::unique_ptr<Task> make_ruler_niah_single_3_task();
std::unique_ptr<Task> make_ruler_niah_multikey_1_task();
std::unique_ptr<Task> make_ruler_niah_multikey_2_task();
std::unique_ptr<Task> make_ruler_niah_multikey_3_task();
std::unique_ptr<Task> make_ruler_niah_multivalue_task();
std::unique_ptr<Task> make_ruler_niah_multiquery_task();
std::unique_ptr<Task> make_ruler_vt_task();
std::unique_ptr<Task> make_ruler_cwe_task();
std::unique_ptr<Task> make_ruler_fwe_task();
std::unique_ptr<Task> make_niah_task();

namespace {

const std::vector<std::pair<std::string, std::function<std::unique_ptr<Task>()>>>& registry() {
  static const std::vector<std::pair<std::string, std::function<std::unique_ptr<Task>()>>> tasks = {
      {"copa", make_copa_task},
      {"piqa", make_piqa_task},
      {"winogrande", make_winogrande_task},
      {"openbookqa", make_openbookqa_task},
      {"rte", make_rte_task},
      {"mathqa", make_mathqa_task},
      {"mathqa_cot", make_mathqa_cot_task},
      {"xsum", make_xsum_task},
      {"cnndm", make_cnndm_task},
      {"perplexity", make_perplexity_task},
      {"ruler_niah_single_1", make_ruler_niah_single_1_task},
      {"ruler_niah_single_2", make_ruler_niah_single_2_task},
      {"ruler_niah_single_3", make_ruler_niah_single_3_task},
      {"ruler_niah_multikey_1", make_ruler_niah_multikey_1_task},
      {"ruler_niah_multikey_2", make_ruler_niah_multikey_2_task},
      {"ruler_niah_multikey_3", make_ruler_niah_multikey_3_task},
      {"ruler_niah_multivalue", make_ruler_niah_multivalue_task},
      {"ruler_niah_multiquery", make_ruler_niah_multiquery_task},
      {"ruler_vt", make_ruler_vt_task},
      {"ruler_cwe", make_ruler_cwe_task},
      {"ruler_fwe", make_ruler_fwe_task},
      {"niah", make_niah_task},
  };
  return tasks;
}

}  // namespace

std::vector<std::string> task_names() {
  std::vector<std::string> names;
  for (const auto& entry : registry()) names.push_back(entry.first);
  return names;
}

std::unique_ptr<Task> make_task(const std::string& name) {
  for (const auto& [known, make] : registry())
    if (known == name) return make();
  std::string known_list;
  for (const auto& known : task_names()) known_list += (known_list.empty() ? "" : ", ") + known;
  throw Error("unknown task \"" + name + "\" (known tasks: " + known_list + ")");
}

}  // namespace kvevict
