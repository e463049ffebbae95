# Apple: the Metal implementation beside the CPU runtime (csrc/gpu/metal).
enable_language(OBJCXX)
target_sources(_core PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc/gpu/metal/metal_device.mm)
set_target_properties(_core PROPERTIES OBJCXX_STANDARD 20 OBJCXX_STANDARD_REQUIRED ON)
# Not a blanket -Werror: new SDKs deprecate API the macOS 14 path still needs.
target_compile_options(_core PRIVATE
  $<$<COMPILE_LANGUAGE:OBJCXX>:-fobjc-arc -Werror=objc-method-access -Werror=unguarded-availability-new>)
find_library(MQ_METAL_FRAMEWORK Metal REQUIRED)
find_library(MQ_FOUNDATION_FRAMEWORK Foundation REQUIRED)
# Without CoreGraphics, MTLCreateSystemDefaultDevice returns nil in command-line processes
# (Apple's documentation); tools/metal_check/run.sh checks this link stays.
find_library(MQ_COREGRAPHICS_FRAMEWORK CoreGraphics REQUIRED)
target_link_libraries(_core PRIVATE ${MQ_METAL_FRAMEWORK} ${MQ_FOUNDATION_FRAMEWORK} ${MQ_COREGRAPHICS_FRAMEWORK})
target_compile_definitions(_core PRIVATE MQ_HAVE_METAL=1)

# The prebuilt library, where Apple's Metal compiler exists (Xcode installed): every shader file
# compiled at build time, as one translation unit, into metalqwen.metallib beside _core. The
# engine loads it with newLibraryWithURL: (as MLX loads mlx.metallib) when its key kernel matches
# the embedded shaders (tools/metallib_source.cmake); without it, each model compiles its own
# kernels from the embedded source at load. Same language version and math as that compile
# (metal_device.mm: MSL 3.1, no fast math).
execute_process(COMMAND xcrun -sdk macosx --find metal OUTPUT_VARIABLE MQ_METAL_COMPILER
                RESULT_VARIABLE mq_no_metal_compiler OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
execute_process(COMMAND xcrun -sdk macosx --find metallib OUTPUT_VARIABLE MQ_METALLIB_LINKER
                RESULT_VARIABLE mq_no_metallib_linker OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(mq_no_metal_compiler EQUAL 0 AND mq_no_metallib_linker EQUAL 0)
  set(mq_library_source ${CMAKE_CURRENT_BINARY_DIR}/metalqwen_library.metal)
  set(mq_library_air ${CMAKE_CURRENT_BINARY_DIR}/metalqwen.air)
  set(mq_metallib ${CMAKE_CURRENT_BINARY_DIR}/metalqwen.metallib)
  add_custom_command(
    OUTPUT ${mq_library_source}
    COMMAND ${CMAKE_COMMAND} -DOUT=${mq_library_source} -DROOT=${CMAKE_CURRENT_SOURCE_DIR}/shaders
            "-DFILES=${MQ_SHADER_FILES}" -P ${CMAKE_CURRENT_SOURCE_DIR}/tools/metallib_source.cmake
    DEPENDS ${MQ_SHADER_FILES} ${CMAKE_CURRENT_SOURCE_DIR}/tools/metallib_source.cmake
            ${CMAKE_CURRENT_SOURCE_DIR}/tools/shader_key.cmake
    VERBATIM)
  add_custom_command(
    OUTPUT ${mq_library_air}
    COMMAND ${MQ_METAL_COMPILER} -std=metal3.1 -fno-fast-math -mmacosx-version-min=14.0 -Wall
            -c ${mq_library_source} -o ${mq_library_air}
    DEPENDS ${mq_library_source}
    VERBATIM)
  add_custom_command(
    OUTPUT ${mq_metallib}
    COMMAND ${MQ_METALLIB_LINKER} ${mq_library_air} -o ${mq_metallib}
    DEPENDS ${mq_library_air}
    VERBATIM)
  add_custom_target(metalqwen_metallib ALL DEPENDS ${mq_metallib})
  add_dependencies(_core metalqwen_metallib)
  install(FILES ${mq_metallib} DESTINATION metalqwen)
  message(STATUS "metalqwen: prebuilt Metal library with ${MQ_METAL_COMPILER}")
else()
  message(STATUS "metalqwen: no Metal compiler (xcrun metal): models compile their kernels from source at load")
endif()
