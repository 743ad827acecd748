# Writes OUT, a C++ header that holds the text of INPUT as the constant NAME, so a file
# kept in the source tree for readability (the notebook's Python) is compiled in and never
# looked up at run time. Run as: cmake -DINPUT=... -DOUT=... -DNAME=... -P embed_text.cmake
file(READ "${INPUT}" text)
string(FIND "${text}" ")kvevict_embed\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string delimiter )kvevict_embed\"")
endif()
get_filename_component(input_name "${INPUT}" NAME)
file(WRITE "${OUT}.tmp"
  "// Generated from ${input_name} by cmake/embed_text.cmake: edit that file instead.\n"
  "#pragma once\n\n"
  "namespace kvevict {\n"
  "inline constexpr const char* ${NAME} = R\"kvevict_embed(${text})kvevict_embed\";\n"
  "}  // namespace kvevict\n")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")
file(REMOVE "${OUT}.tmp")
