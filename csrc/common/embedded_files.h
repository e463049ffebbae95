// Text files compiled into the extension (MSL sources and the CPU runtime's
// headers), so installing needs no shader toolchain and no data files.
#pragma once
#include <cstddef>

namespace mq {

struct EmbeddedFile {
  const char* path;  // relative to the folder it was embedded from
  const char* text;
};

struct EmbeddedFiles {
  const EmbeddedFile* files;
  size_t count;
  const char* key;  // SHA-256 of the files (tools/shader_key.cmake), 32 hex digits
};

extern const EmbeddedFiles kCpuRuntimeHeaders;  // csrc/gpu/cpu: abi.h and msl/*
extern const EmbeddedFiles kShaderFiles;        // shaders/: *.metal and their headers

}  // namespace mq
