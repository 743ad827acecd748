// The registry: one line per policy, name -> factory (defined in that policy's file).
// Included by registry.cpp with KVEVICT_POLICY defined.
KVEVICT_POLICY("full", make_full_policy)
KVEVICT_POLICY("local", make_local_policy)
KVEVICT_POLICY("random", make_random_policy)
KVEVICT_POLICY("h2o", make_h2o_policy)
KVEVICT_POLICY("h2o-paper", make_h2o_paper_policy)
KVEVICT_POLICY("h2o-global", make_h2o_global_policy)
KVEVICT_POLICY("streamingllm", make_streamingllm_policy)
KVEVICT_POLICY("tova", make_tova_policy)
KVEVICT_POLICY("snapkv", make_snapkv_policy)
KVEVICT_POLICY("pyramidkv", make_pyramidkv_policy)
KVEVICT_POLICY("scissorhands", make_scissorhands_policy)
KVEVICT_POLICY("knorm", make_knorm_policy)
