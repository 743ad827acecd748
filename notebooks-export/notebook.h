// Turns result rows into a self-contained Jupyter notebook (nbformat 4.5): the CSV is
// embedded, and the code cells load it with pandas and draw, with matplotlib, the same
// figures as svg_plot.h (metric against budget; heavy-share ablation). The notebook runs
// headless (`jupyter nbconvert --to notebook --execute`) and skips figures without data.
#pragma once
#include <string>
#include <vector>

#include "notebooks-export/results_csv.h"

namespace kvevict {

// The notebook document as JSON text.
std::string notebook_json(const std::vector<ResultRow>& rows);

// Writes notebook_json(rows) to ipynb_path (via a temporary file and rename, so a
// reader never sees half a notebook). Throws kvevict::Error if it cannot be written.
void write_notebook(const std::vector<ResultRow>& rows, const std::string& ipynb_path);

}  // namespace kvevict
