# cmake -DOUT=file.cpp -DROOT=dir -DSYMBOL=name -DFILES=a;b -P embed_files.cmake
# Writes a C++ file defining `mq::SYMBOL` (EmbeddedFiles) with each file's text and the
# files' key (shader_key.cmake).
include(${CMAKE_CURRENT_LIST_DIR}/shader_key.cmake)
mq_shader_key(key "${ROOT}" ${FILES})
set(body "")
set(count 0)
foreach(path IN LISTS FILES)
  file(READ "${path}" text)
  file(RELATIVE_PATH rel "${ROOT}" "${path}")
  string(APPEND body "  {\"${rel}\", R\"mq_embed(${text})mq_embed\"},\n")
  math(EXPR count "${count} + 1")
endforeach()
file(WRITE "${OUT}.tmp" "#include \"common/embedded_files.h\"\nnamespace mq {\nstatic const EmbeddedFile k${SYMBOL}Files[] = {\n${body}};\nconst EmbeddedFiles ${SYMBOL} = {k${SYMBOL}Files, ${count}, \"${key}\"};\n}  // namespace mq\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
