# mq_shader_key(<var> <root> <files...>): a SHA-256 over the files' paths (relative to <root>)
# and texts, in sorted order. embed_files.cmake stores it with the embedded shaders and
# metallib_source.cmake compiles it into the metallib: the engine uses a prebuilt library only
# when the two agree (built from the same files).
function(mq_shader_key var root)
  set(files ${ARGN})
  list(SORT files)
  set(all "")
  foreach(path IN LISTS files)
    file(READ "${path}" text)
    file(RELATIVE_PATH rel "${root}" "${path}")
    string(APPEND all "${rel}\n${text}\n")
  endforeach()
  string(SHA256 key "${all}")
  string(SUBSTRING "${key}" 0 32 key)
  set(${var} "${key}" PARENT_SCOPE)
endfunction()
