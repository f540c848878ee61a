// fairgate/version.hpp
#pragma once

#include <string_view>

namespace fairgate {
inline constexpr std::string_view kVersion = "0.1.0";
}
