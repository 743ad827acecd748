// The dtypes a model runs in, by name, without LibTorch: the sweep checks a config's
// "dtype" before it runs or submits anything, and model.cpp maps each to its torch type.
#pragma once
#include <string>

#include "harness/common/enum_names.h"

namespace kvevict {

enum class DtypeName { Float32, BFloat16, Float16, Float64 };  // Float64: reference checks

inline constexpr EnumName<DtypeName> kDtypeNames[] = {
    {DtypeName::Float32, "float32"},  {DtypeName::Float32, "fp32"},  {DtypeName::BFloat16, "bfloat16"},
    {DtypeName::BFloat16, "bf16"},    {DtypeName::Float16, "float16"}, {DtypeName::Float16, "fp16"},
    {DtypeName::Float64, "float64"},  {DtypeName::Float64, "fp64"}};

// Throws kvevict::Error `unknown dtype "NAME" (use float32, bfloat16, float16 or float64)`.
inline DtypeName parse_dtype_name(const std::string& name) { return parse_enum(kDtypeNames, "dtype", name); }

}  // namespace kvevict
