// Linux syntax-check stand-in for <Metal/Metal.h>: hand-written declarations of
// exactly the Metal subset csrc/gpu/metal/*.mm uses, from Apple's documentation,
// with the SDK's enum values. Not Apple's header; never used to build for real.
// tools/metal_check/check_api_names.py checks every name here against the SDK.
#pragma once

#import <Foundation/Foundation.h>

#define MTL_EXTERN extern "C"

typedef struct {
  NSUInteger width, height, depth;
} MTLSize;

static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth) {
  MTLSize size;
  size.width = width;
  size.height = height;
  size.depth = depth;
  return size;
}

typedef NS_OPTIONS(NSUInteger, MTLResourceOptions) {
  MTLResourceStorageModeShared = 0,
  MTLResourceHazardTrackingModeUntracked = 1UL << 8,
};

typedef NS_ENUM(NSUInteger, MTLDispatchType) {
  MTLDispatchTypeConcurrent = 1,
};

typedef NS_OPTIONS(NSUInteger, MTLBarrierScope) {
  MTLBarrierScopeBuffers = 1,
};

typedef NS_ENUM(NSUInteger, MTLCommandBufferStatus) {
  MTLCommandBufferStatusError = 5,
};

typedef NS_OPTIONS(NSUInteger, MTLCommandBufferErrorOption) {
  MTLCommandBufferErrorOptionEncoderExecutionStatus = 1 << 0,
};

typedef NS_ENUM(NSInteger, MTLCommandEncoderErrorState) {
  MTLCommandEncoderErrorStateFaulted = 4,
};

typedef NS_ENUM(NSUInteger, MTLFunctionType) {
  MTLFunctionTypeKernel = 3,
};

typedef NS_ENUM(NSInteger, MTLGPUFamily) {
  MTLGPUFamilyApple7 = 1007,
};

typedef NS_ENUM(NSUInteger, MTLLanguageVersion) {
  MTLLanguageVersion3_1 = (3 << 16) + 1,
} API_AVAILABLE(macos(14.0));

#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
typedef NS_ENUM(NSInteger, MTLMathMode) {
  MTLMathModeSafe = 0,
} API_AVAILABLE(macos(15.0));

typedef NS_ENUM(NSInteger, MTLMathFloatingPointFunctions) {
  MTLMathFloatingPointFunctionsPrecise = 1,
} API_AVAILABLE(macos(15.0));
#endif

@interface MTLCompileOptions : NSObject
@property(readwrite, nonatomic) MTLLanguageVersion languageVersion;
@property(readwrite, nonatomic) BOOL fastMathEnabled API_DEPRECATED("Use mathMode instead", macos(10.11, 15.0));
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
@property(readwrite, nonatomic) MTLMathMode mathMode API_AVAILABLE(macos(15.0));
@property(readwrite, nonatomic) MTLMathFloatingPointFunctions mathFloatingPointFunctions API_AVAILABLE(macos(15.0));
#endif
@end

#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
@protocol MTLAllocation <NSObject>
@end

@protocol MTLResource <MTLAllocation>
@end

API_AVAILABLE(macos(15.0))
@interface MTLResidencySetDescriptor : NSObject
@end

API_AVAILABLE(macos(15.0))
@protocol MTLResidencySet <NSObject>
- (void)addAllocation:(id<MTLAllocation>)allocation;
- (void)removeAllocation:(id<MTLAllocation>)allocation;
- (void)commit;
- (void)requestResidency;
@end
#else
@protocol MTLResource <NSObject>
@end
#endif

@protocol MTLBuffer <MTLResource>
- (void*)contents;
@end

@protocol MTLFunction <NSObject>
@property(readonly) MTLFunctionType functionType;
@end

@protocol MTLLibrary <NSObject>
@property(readonly) NSArray<NSString*>* functionNames;
- (id<MTLFunction>)newFunctionWithName:(NSString*)functionName;
@end

@protocol MTLComputePipelineState <NSObject>
@property(readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@property(readonly) NSUInteger threadExecutionWidth;
@end

@protocol MTLCommandEncoder <NSObject>
@property(copy, atomic) NSString* label;
- (void)endEncoding;
@end

@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)dispatchThreads:(MTLSize)threadsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)memoryBarrierWithScope:(MTLBarrierScope)scope;
@end

// NSErrorUserInfoKey (a typedef of NSString*) in the SDK.
MTL_EXTERN NSString* const MTLCommandBufferEncoderInfoErrorKey API_AVAILABLE(macos(11.0));

@interface MTLCommandBufferDescriptor : NSObject
@property(readwrite, nonatomic) MTLCommandBufferErrorOption errorOptions;
@end

@protocol MTLCommandBufferEncoderInfo <NSObject>
@property(readonly, nonatomic) NSString* label;
@property(readonly, nonatomic) MTLCommandEncoderErrorState errorState;
@end

@protocol MTLCommandBuffer <NSObject>
@property(copy, atomic) NSString* label;
@property(readonly) MTLCommandBufferStatus status;
@property(readonly) NSError* error;
// CFTimeInterval in the SDK: a typedef of double (CoreFoundation, which these stubs leave out).
@property(readonly) double GPUStartTime;
@property(readonly) double GPUEndTime;
- (id<MTLComputeCommandEncoder>)computeCommandEncoderWithDispatchType:(MTLDispatchType)dispatchType;
- (void)commit;
- (void)waitUntilCompleted;
@end

@protocol MTLCommandQueue <NSObject>
- (id<MTLCommandBuffer>)commandBufferWithDescriptor:(MTLCommandBufferDescriptor*)descriptor;
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
- (void)addResidencySet:(id<MTLResidencySet>)residencySet API_AVAILABLE(macos(15.0));
#endif
@end

API_AVAILABLE(macos(14.0))
@interface MTLArchitecture : NSObject
@property(readonly) NSString* name;
@end

@protocol MTLDevice <NSObject>
@property(readonly) NSString* name;
@property(readonly) MTLArchitecture* architecture API_AVAILABLE(macos(14.0));
@property(readonly) NSUInteger maxThreadgroupMemoryLength;
@property(readonly) NSUInteger maxBufferLength;
@property(readonly) uint64_t recommendedMaxWorkingSetSize;
- (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily;
- (id<MTLCommandQueue>)newCommandQueue;
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (id<MTLBuffer>)newBufferWithBytes:(const void*)pointer length:(NSUInteger)length options:(MTLResourceOptions)options;
- (id<MTLBuffer>)newBufferWithBytesNoCopy:(void*)pointer
                                   length:(NSUInteger)length
                                  options:(MTLResourceOptions)options
                              deallocator:(void (^)(void* pointer, NSUInteger length))deallocator;
- (id<MTLLibrary>)newLibraryWithSource:(NSString*)source options:(MTLCompileOptions*)options error:(NSError**)error;
- (id<MTLLibrary>)newLibraryWithURL:(NSURL*)url error:(NSError**)error;
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                             error:(NSError**)error;
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
- (id<MTLResidencySet>)newResidencySetWithDescriptor:(MTLResidencySetDescriptor*)desc
                                               error:(NSError**)error API_AVAILABLE(macos(15.0));
#endif
// The SDK spells the block type MTLNewComputePipelineStateCompletionHandler.
- (void)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                          completionHandler:(void (^)(id<MTLComputePipelineState> computePipelineState,
                                                      NSError* error))completionHandler;
@end

MTL_EXTERN id<MTLDevice> MTLCreateSystemDefaultDevice(void) NS_RETURNS_RETAINED;
MTL_EXTERN NSArray<id<MTLDevice>>* MTLCopyAllDevices(void) NS_RETURNS_RETAINED;
