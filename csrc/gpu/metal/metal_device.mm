// device.h over Metal. Each method forwards to one or two Metal calls; the checks
// Metal would otherwise assert on, and other plain C++, live in metal_rules.h.
// Objective-C++ with ARC: Objective-C pointers held in C++ members are strong.
#include "gpu/metal/metal_device.h"

#include <dlfcn.h>   // dladdr
#include <unistd.h>  // sysconf, access

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gpu/apple_chips.h"
#include "gpu/metal/metal_rules.h"
#include "gpu/resident_ledger.h"

#include <Metal/Metal.h>

namespace mq::gpu {
namespace {

// Runs `body` in an autorelease pool and rethrows its exception after the pool is
// drained: a C++ exception leaving @autoreleasepool would skip the drain, and with
// no outer pool (Python threads have none) autoreleased objects would pile up.
template <class Body>
void in_pool(Body&& body) {
  std::exception_ptr failure;
  @autoreleasepool {
    try {
      body();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

std::string to_string(NSString* text) {
  const char* utf8 = text == nil ? nullptr : text.UTF8String;
  return utf8 == nullptr ? std::string() : std::string(utf8);
}

std::string describe(NSError* error) {
  return error == nil ? std::string("unknown error") : to_string(error.localizedDescription);
}

MTLSize to_mtl(Size3 s) { return MTLSizeMake(s.x, s.y, s.z); }

NSString* to_ns(const std::string& text) {
  return [[NSString alloc] initWithBytes:text.data() length:text.size() encoding:NSUTF8StringEncoding];
}

// A failed buffer's message: its label, Metal's description and, as the buffer was made to
// record them (MTLCommandBufferErrorOptionEncoderExecutionStatus), each encoder's state.
std::string describe_failure(id<MTLCommandBuffer> commands) {
  NSError* error = commands.error;
  std::vector<metal::EncoderStatus> encoders;
  NSArray<id<MTLCommandBufferEncoderInfo>>* infos =
      error == nil ? nil : [error.userInfo objectForKey:MTLCommandBufferEncoderInfoErrorKey];
  for (NSUInteger i = 0; i < infos.count; ++i) {
    id<MTLCommandBufferEncoderInfo> info = [infos objectAtIndex:i];
    encoders.push_back({to_string(info.label), static_cast<long>(info.errorState)});
  }
  return metal::describe_failed_buffer(to_string(commands.label), describe(error), encoders);
}

// IEEE-safe arithmetic and precise math functions, so numerics track the CPU runtime.
void disable_fast_math(MTLCompileOptions* options) {
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000  // macOS 15 SDK: mathMode replaces fastMathEnabled
  if (@available(macOS 15.0, *)) {
    options.mathMode = MTLMathModeSafe;
    // mathMode alone would keep the fast math functions, their default.
    options.mathFloatingPointFunctions = MTLMathFloatingPointFunctionsPrecise;
    return;
  }
#endif
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"  // deprecated in macOS 15, replaced above
  options.fastMathEnabled = NO;  // = Safe + Precise, per Apple's mathMode documentation
#pragma clang diagnostic pop
}

MTLCompileOptions* new_compile_options() {
  MTLCompileOptions* options = [[MTLCompileOptions alloc] init];
  // bfloat needs MSL 3.1; open_metal_device refuses macOS < 14, where this is unavailable.
  if (@available(macOS 14.0, *)) options.languageVersion = MTLLanguageVersion3_1;
  disable_fast_math(options);
  return options;
}

// Nil from MTLCreateSystemDefaultDevice in processes that do not link CoreGraphics
// (cmake/metal.cmake links it); MTLCopyAllDevices lists the GPUs regardless.
id<MTLDevice> system_device() {
  id<MTLDevice> device = MTLCreateSystemDefaultDevice();
  if (device == nil) device = MTLCopyAllDevices().firstObject;
  return device;
}

// Shared storage; read-only buffers (the weights) untracked: nothing on the GPU writes them.
MTLResourceOptions resource_options(Access access) {
  return access == Access::read_only ? MTLResourceStorageModeShared | MTLResourceHazardTrackingModeUntracked
                                     : MTLResourceStorageModeShared;
}

// The device's MTLResidencySet (macOS 15+), attached to its queue: the buffers in it stay wired
// across idle pauses. Shared with those buffers, so one freed after the device still leaves it.
// Held as id<NSObject> because the type does not exist before macOS 15; calls are serialised.
class ResidencySet {
 public:
  // Nullptr where there are no residency sets: macOS 14, or a GPU without them (virtual machines).
  static std::shared_ptr<ResidencySet> create(id<MTLDevice> device, id<MTLCommandQueue> queue) {
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000  // macOS 15 SDK: residency sets
    if (@available(macOS 15.0, *)) {
      MTLResidencySetDescriptor* descriptor = [[MTLResidencySetDescriptor alloc] init];
      NSError* error = nil;
      id<MTLResidencySet> set = [device newResidencySetWithDescriptor:descriptor error:&error];
      if (set == nil) return nullptr;  // the buffers are then paged by the OS as without the set
      [queue addResidencySet:set];
      auto result = std::make_shared<ResidencySet>();
      result->set_ = set;
      return result;
    }
#endif
    (void)device;
    (void)queue;
    return nullptr;
  }

  // Adds `buffers`, commits the set and asks for its residency now.
  void add(const std::vector<id<MTLBuffer>>& buffers) {
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
    if (@available(macOS 15.0, *)) {
      std::lock_guard<std::mutex> lock(mutex_);
      id<MTLResidencySet> set = (id<MTLResidencySet>)set_;
      for (id<MTLBuffer> buffer : buffers) [set addAllocation:buffer];
      [set commit];
      [set requestResidency];
    }
#endif
    (void)buffers;
  }

  void remove(id<MTLBuffer> buffer) {
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
    if (@available(macOS 15.0, *)) {
      std::lock_guard<std::mutex> lock(mutex_);
      id<MTLResidencySet> set = (id<MTLResidencySet>)set_;
      [set removeAllocation:buffer];
      [set commit];
    }
#endif
    (void)buffer;
  }

 private:
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
  std::mutex mutex_;
  id<NSObject> set_ = nil;
#endif
};

class MetalBuffer final : public Buffer {
 public:
  MetalBuffer(id<MTLBuffer> buffer, size_t size) : buffer_(buffer), size_(size) {}
  ~MetalBuffer() override {
    if (residency_) {
      @autoreleasepool {
        residency_->remove(buffer_);
      }
    }
  }
  void* contents() override { return [buffer_ contents]; }
  size_t size() const override { return size_; }
  id<MTLBuffer> handle() const { return buffer_; }
  // Called once, when the buffer is added to `set`.
  void join(std::shared_ptr<ResidencySet> set) { residency_ = std::move(set); }

 private:
  id<MTLBuffer> buffer_;
  size_t size_;  // as asked for; Metal allocates at least 1 byte
  std::shared_ptr<ResidencySet> residency_;  // the set holding the buffer, if any
};

class MetalKernel final : public Kernel {
 public:
  MetalKernel(std::string name, id<MTLComputePipelineState> pipeline)
      : name_(std::move(name)),
        pipeline_(pipeline),
        max_threads_(static_cast<uint32_t>(pipeline.maxTotalThreadsPerThreadgroup)),
        execution_width_(static_cast<uint32_t>(pipeline.threadExecutionWidth)) {}
  const std::string& name() const override { return name_; }
  uint32_t max_threads_per_threadgroup() const override { return max_threads_; }
  uint32_t thread_execution_width() const override { return execution_width_; }
  id<MTLComputePipelineState> handle() const { return pipeline_; }

 private:
  std::string name_;
  id<MTLComputePipelineState> pipeline_;
  uint32_t max_threads_;
  uint32_t execution_width_;
};

class MetalLibrary final : public Library {
 public:
  MetalLibrary(id<MTLDevice> device, id<MTLLibrary> library) : device_(device), library_(library) {}

  std::shared_ptr<Kernel> kernel(const std::string& name) override { return kernels({name}, {}).front(); }

  // Every pipeline not made yet is asked for at once (newComputePipelineStateWithFunction:
  // completionHandler:): Metal compiles them concurrently, each handler on a thread of its own,
  // and this thread waits for them, reporting each one as it completes.
  std::vector<std::shared_ptr<Kernel>> kernels(const std::vector<std::string>& names,
                                               const std::function<void(size_t done)>& built) override {
    struct Pending {
      std::mutex mutex;
      std::condition_variable completed;
      size_t finished = 0;
      std::string error;
      std::vector<std::pair<std::string, id<MTLComputePipelineState>>> pipelines;
    };
    auto pending = std::make_shared<Pending>();
    size_t ready = 0, asked = 0;
    std::vector<id<MTLFunction>> functions;  // alive until every handler has run
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_pool([&] {
        for (const std::string& name : names) {
          if (pipelines_.count(name)) {
            ++ready;
            continue;
          }
          functions.push_back(function(name));
          ++asked;
          const std::string kernel_name = name;  // the block keeps its own copy
          [device_ newComputePipelineStateWithFunction:functions.back()
                                     completionHandler:^(id<MTLComputePipelineState> pipeline, NSError* error) {
                                       std::lock_guard<std::mutex> done(pending->mutex);
                                       if (pipeline == nil && pending->error.empty()) {
                                         pending->error = "[metal] cannot create the pipeline of kernel '" +
                                                          kernel_name + "': " + describe(error);
                                       }
                                       pending->pipelines.emplace_back(kernel_name, pipeline);
                                       ++pending->finished;
                                       pending->completed.notify_all();
                                     }];
        }
      });
    }
    if (built && ready) built(ready);
    for (size_t reported = 0; reported < asked;) {
      std::unique_lock<std::mutex> lock(pending->mutex);
      pending->completed.wait(lock, [&] { return pending->finished > reported; });
      reported = pending->finished;
      lock.unlock();
      if (built) built(ready + reported);
    }
    if (!pending->error.empty()) throw GpuError(pending->error);
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, pipeline] : pending->pipelines)
      pipelines_.emplace(name, std::make_shared<MetalKernel>(name, pipeline));
    std::vector<std::shared_ptr<Kernel>> result;
    for (const std::string& name : names) result.push_back(pipelines_.at(name));
    return result;
  }

  std::vector<std::string> kernel_names() const override {
    std::vector<std::string> names;
    in_pool([&] {
      NSArray<NSString*>* functions = library_.functionNames;
      for (NSUInteger i = 0; i < functions.count; ++i) names.push_back(to_string([functions objectAtIndex:i]));
    });
    return names;
  }

 private:
  // Throws GpuError when the library has no such kernel function.
  id<MTLFunction> function(const std::string& name) const {
    NSString* function_name = to_ns(name);
    id<MTLFunction> function = function_name == nil ? nil : [library_ newFunctionWithName:function_name];
    if (function == nil) throw GpuError("[metal] library has no kernel function '" + name + "'");
    if (function.functionType != MTLFunctionTypeKernel)
      throw GpuError("[metal] function '" + name + "' is not a kernel");
    return function;
  }

  id<MTLDevice> device_;
  id<MTLLibrary> library_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<MetalKernel>> pipelines_;
};

class MetalCommandBuffer final : public CommandBuffer {
 public:
  MetalCommandBuffer(id<MTLCommandBuffer> commands, size_t max_threadgroup_memory)
      : commands_(commands), rules_(max_threadgroup_memory) {}

  ~MetalCommandBuffer() override {
    // Metal asserts when an encoder is released without endEncoding.
    if (encoder_ != nil && !rules_.committed()) {
      @autoreleasepool {
        [encoder_ endEncoding];
      }
    }
  }

  void set_label(const std::string& label) override {
    rules_.check_open("set_label");
    in_pool([&] {
      NSString* text = to_ns(label);
      commands_.label = text;
      if (encoder_ != nil) encoder_.label = text;
    });
  }

  void set_kernel(const std::shared_ptr<Kernel>& kernel) override {
    auto* metal = dynamic_cast<MetalKernel*>(kernel.get());
    if (metal == nullptr) rules_.fail("set_kernel", "the kernel is null or not a Metal kernel");
    rules_.set_kernel(metal->name(), metal->max_threads_per_threadgroup());
    [encoder() setComputePipelineState:metal->handle()];
  }

  void set_buffer(uint32_t index, const std::shared_ptr<Buffer>& buffer, size_t offset) override {
    auto* metal = dynamic_cast<MetalBuffer*>(buffer.get());
    if (metal == nullptr) {
      rules_.fail("set_buffer", "the buffer at index " + std::to_string(index) + " is null or not a Metal buffer");
    }
    rules_.check_buffer(index, offset, metal->size());
    [encoder() setBuffer:metal->handle() offset:offset atIndex:index];
  }

  void set_bytes(uint32_t index, const void* data, size_t size) override {
    rules_.check_bytes(index, data, size);
    [encoder() setBytes:data length:size atIndex:index];
  }

  void set_threadgroup_memory(uint32_t index, size_t size) override {
    rules_.check_threadgroup_memory(index, size);
    [encoder() setThreadgroupMemoryLength:size atIndex:index];
  }

  void dispatch_threadgroups(Size3 threadgroups, Size3 threads_per_threadgroup) override {
    rules_.check_dispatch("dispatch_threadgroups", threadgroups, threads_per_threadgroup);
    [encoder() dispatchThreadgroups:to_mtl(threadgroups) threadsPerThreadgroup:to_mtl(threads_per_threadgroup)];
  }

  // Needs non-uniform threadgroup support: every Apple-silicon GPU (Apple4 family and up) has it.
  void dispatch_threads(Size3 threads, Size3 threads_per_threadgroup) override {
    rules_.check_dispatch("dispatch_threads", threads, threads_per_threadgroup);
    [encoder() dispatchThreads:to_mtl(threads) threadsPerThreadgroup:to_mtl(threads_per_threadgroup)];
  }

  void barrier() override {
    rules_.check_open("barrier");
    if (encoder_ != nil) [encoder_ memoryBarrierWithScope:MTLBarrierScopeBuffers];
  }

  void commit() override {
    rules_.mark_committed();
    in_pool([&] {
      if (encoder_ != nil) [encoder_ endEncoding];
      encoder_ = nil;
      [commands_ commit];
    });
  }

  void wait() override {
    if (!rules_.committed()) throw GpuError("[metal] wait: command buffer not committed");
    in_pool([&] {
      [commands_ waitUntilCompleted];
      if (commands_.status == MTLCommandBufferStatusError) throw GpuError(describe_failure(commands_));
    });
  }

  double gpu_seconds() const override {
    if (!rules_.committed()) throw GpuError("[metal] gpu_seconds: command buffer not committed");
    return commands_.GPUEndTime - commands_.GPUStartTime;
  }

 private:
  // One compute encoder per command buffer, opened on first use and named as the buffer;
  // concurrent dispatch matches device.h: only barrier() orders dispatches.
  id<MTLComputeCommandEncoder> encoder() {
    if (encoder_ == nil) {
      in_pool([&] {
        encoder_ = [commands_ computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
        encoder_.label = commands_.label;
      });
      if (encoder_ == nil) throw GpuError("[metal] cannot create a compute command encoder");
    }
    return encoder_;
  }

  id<MTLCommandBuffer> commands_;
  id<MTLComputeCommandEncoder> encoder_ = nil;
  metal::EncoderRules rules_;
};

// The process's libraries by (MTLDevice, source): MetalDevice::compile and prebuilt_library.
using LibraryKey = std::pair<const void*, std::string>;
std::mutex library_cache_mutex;
std::map<LibraryKey, std::shared_ptr<Library>> library_cache;

std::shared_ptr<Library> cached_library(const LibraryKey& key) {
  std::lock_guard<std::mutex> lock(library_cache_mutex);
  auto found = library_cache.find(key);
  return found == library_cache.end() ? nullptr : found->second;
}

std::shared_ptr<Library> remember_library(const LibraryKey& key, std::shared_ptr<Library> library) {
  std::lock_guard<std::mutex> lock(library_cache_mutex);
  return library_cache.emplace(key, std::move(library)).first->second;
}

// metalqwen.metallib in the folder of the module holding this code, or "" when unknown.
std::string metallib_path() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<const void*>(&metallib_path), &info) || info.dli_fname == nullptr) return "";
  const std::string module = info.dli_fname;
  const size_t slash = module.rfind('/');
  return slash == std::string::npos ? "" : module.substr(0, slash) + "/metalqwen.metallib";
}

class MetalDevice final : public Device {
 public:
  explicit MetalDevice(id<MTLDevice> device)
      : device_(device),
        name_(to_string(device.name)),
        max_threadgroup_memory_(device.maxThreadgroupMemoryLength),
        max_buffer_length_(device.maxBufferLength),
        recommended_working_set_(device.recommendedMaxWorkingSetSize) {
    std::string architecture;
    if (@available(macOS 14.0, *)) architecture = to_string(device.architecture.name);
    gpu_cores_ = apple_gpu_cores(name_, architecture);
    queue_ = [device_ newCommandQueue];
    if (queue_ == nil) throw GpuError("[metal] cannot create a command queue on " + name_);
    residency_ = ResidencySet::create(device_, queue_);
    // A failed buffer's error then lists each encoder's execution state (describe_failure).
    descriptor_ = [[MTLCommandBufferDescriptor alloc] init];
    descriptor_.errorOptions = MTLCommandBufferErrorOptionEncoderExecutionStatus;
  }

  std::string kind() const override { return "metal"; }
  std::string name() const override { return name_; }
  size_t max_buffer_length() const override { return max_buffer_length_; }
  uint64_t recommended_working_set() const override { return recommended_working_set_; }
  uint32_t gpu_cores() const override { return gpu_cores_; }

  std::shared_ptr<Buffer> new_buffer(size_t size, Access access) override {
    check_buffer_length("metal", name_, size, max_buffer_length_);
    std::shared_ptr<Buffer> result;
    in_pool([&] {
      id<MTLBuffer> buffer = [device_ newBufferWithLength:(size == 0 ? 1 : size) options:resource_options(access)];
      if (buffer == nil) throw GpuError("[metal] cannot allocate a " + std::to_string(size) + "-byte buffer");
      result = std::make_shared<MetalBuffer>(buffer, size);
    });
    return result;
  }

  std::shared_ptr<Buffer> wrap_host_memory(void* data, size_t size, std::shared_ptr<void> keep_alive,
                                           Access access) override {
    if (size == 0) return new_buffer(0, access);
    if (data == nullptr) throw GpuError("[metal] wrap_host_memory: null pointer");
    check_buffer_length("metal", name_, size, max_buffer_length_);
    std::shared_ptr<Buffer> result;
    in_pool([&] {
      id<MTLBuffer> buffer = nil;
      if (metal::host_memory_wrappable(data, size, static_cast<size_t>(sysconf(_SC_PAGESIZE)))) {
        // The block owns a reference until Metal frees the buffer. `keep_alive`
        // itself stays held to the end of this call, so the copy below is safe
        // even if Metal refused the memory and already ran the deallocator.
        __block std::shared_ptr<void> owner = keep_alive;
        buffer = [device_ newBufferWithBytesNoCopy:data
                                            length:size
                                           options:resource_options(access)
                                       deallocator:^(void*, NSUInteger) {
                                         owner.reset();
                                       }];
      }
      if (buffer == nil) {  // not whole pages, or refused: copy (the copy needs no keep_alive)
        buffer = [device_ newBufferWithBytes:data length:size options:resource_options(access)];
      }
      if (buffer == nil) throw GpuError("[metal] cannot allocate a " + std::to_string(size) + "-byte buffer");
      result = std::make_shared<MetalBuffer>(buffer, size);
    });
    return result;
  }

  // The buffers join the residency set (when there is one) and leave it when freed.
  void make_resident(const std::vector<std::shared_ptr<Buffer>>& buffers) override {
    for (const auto& buffer : buffers) {
      if (buffer && dynamic_cast<MetalBuffer*>(buffer.get()) == nullptr)
        throw GpuError("[metal] make_resident: a buffer is not a Metal buffer");
    }
    const std::vector<std::shared_ptr<Buffer>> added = resident_.add(buffers);
    if (!residency_ || added.empty()) return;
    std::vector<id<MTLBuffer>> handles;
    for (const auto& buffer : added) {
      auto* metal = static_cast<MetalBuffer*>(buffer.get());
      metal->join(residency_);
      handles.push_back(metal->handle());
    }
    in_pool([&] { residency_->add(handles); });
  }
  Residency resident() const override { return resident_.count(); }

  // One library per device and source in the process: a second model with the same kernels
  // compiles nothing and reuses the first one's pipelines.
  std::shared_ptr<Library> compile(const std::string& source, const std::string& name) override {
    const LibraryKey key{(__bridge const void*)device_, name + '\0' + source};
    if (std::shared_ptr<Library> cached = cached_library(key)) return cached;
    // Metal calls every source "program_source"; a #line names it in diagnostics.
    const std::string labelled = metal::line_directive(name) + source;
    std::shared_ptr<Library> result;
    in_pool([&] {
      NSString* text = to_ns(labelled);
      if (text == nil) throw CompileError("[metal] MSL source '" + name + "' is not valid UTF-8", "");
      NSError* error = nil;
      id<MTLLibrary> library = [device_ newLibraryWithSource:text options:new_compile_options() error:&error];
      if (library == nil) {
        const std::string diagnostics = describe(error);
        throw CompileError("[metal] MSL '" + name + "' did not compile:\n" + diagnostics, diagnostics);
      }
      result = std::make_shared<MetalLibrary>(device_, library);
    });
    return remember_library(key, result);
  }
  // Metal compiles the source on every load (its own cache speeds repeats up).
  std::string compile_notice(const std::string&, const std::string&) const override {
    return "building the Metal shader library and pipelines";
  }

  // metalqwen.metallib beside this module (cmake/metal.cmake), loaded as MLX loads its own
  // (newLibraryWithURL:). It holds a kernel named mq_library_<key> of the shader files it was
  // compiled from: a library of other files is never used.
  std::shared_ptr<Library> prebuilt_library(const std::string& key) override {
    const std::string path = metallib_path();
    const LibraryKey cache_key{(__bridge const void*)device_, "metallib\0" + path + '\0' + key};
    if (path.empty() || access(path.c_str(), R_OK) != 0) return nullptr;
    if (std::shared_ptr<Library> cached = cached_library(cache_key)) return cached;
    std::shared_ptr<MetalLibrary> result;
    in_pool([&] {
      NSString* file = to_ns(path);
      NSError* error = nil;
      id<MTLLibrary> library = file == nil ? nil
                                           : [device_ newLibraryWithURL:[NSURL fileURLWithPath:file] error:&error];
      if (library == nil) throw GpuError("[metal] cannot load " + path + ": " + describe(error));
      result = std::make_shared<MetalLibrary>(device_, library);
    });
    const std::vector<std::string> names = result->kernel_names();
    if (std::find(names.begin(), names.end(), "mq_library_" + key) == names.end()) return nullptr;
    return remember_library(cache_key, result);
  }

  std::unique_ptr<CommandBuffer> new_command_buffer() override {
    std::unique_ptr<CommandBuffer> result;
    in_pool([&] {
      // Retained references (the descriptor's default): buffers (and wrapped memory) live
      // until the GPU is done.
      id<MTLCommandBuffer> commands = [queue_ commandBufferWithDescriptor:descriptor_];
      if (commands == nil) throw GpuError("[metal] cannot create a command buffer");
      result = std::make_unique<MetalCommandBuffer>(commands, max_threadgroup_memory_);
    });
    return result;
  }

 private:
  id<MTLDevice> device_;
  id<MTLCommandQueue> queue_ = nil;
  std::shared_ptr<ResidencySet> residency_;  // nullptr without residency sets (macOS 14)
  ResidentLedger resident_;
  MTLCommandBufferDescriptor* descriptor_ = nil;
  std::string name_;
  size_t max_threadgroup_memory_;
  size_t max_buffer_length_;
  uint64_t recommended_working_set_;
  uint32_t gpu_cores_ = 0;
};

}  // namespace

std::shared_ptr<Device> open_metal_device() {
  std::shared_ptr<Device> result;
  in_pool([&] {
    bool macos_14 = false;
    if (@available(macOS 14.0, *)) macos_14 = true;
    metal::check_macos_version(macos_14);
    id<MTLDevice> device = system_device();
    if (device == nil) {
      throw GpuError("[metal] no Metal device: MTLCreateSystemDefaultDevice and MTLCopyAllDevices found none "
                     "(a virtual machine without GPU access?)");
    }
    const std::string name = to_string(device.name);
    metal::check_gpu_family(name, [device supportsFamily:MTLGPUFamilyApple7]);
    auto opened = std::make_shared<MetalDevice>(device);
    metal::check_simd_width(name, metal::probe_simd_width(*opened));
    result = opened;
  });
  return result;
}

}  // namespace mq::gpu
