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
