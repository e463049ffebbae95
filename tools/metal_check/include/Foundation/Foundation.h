// Linux syntax-check stand-in for <Foundation/Foundation.h>: hand-written
// declarations of exactly the Foundation subset csrc/gpu/metal/*.mm uses, from
// Apple's documentation. Not Apple's header; never used to build for real.
// tools/metal_check/check_api_names.py checks every name here against the SDK.
#pragma once

#include <stddef.h>
#include <stdint.h>

// The SDK version the stubs stand for (Availability.h); run.sh also checks with 140000,
// where the macOS 15 API below is absent as in the macOS 14 SDK.
#ifndef __MAC_OS_X_VERSION_MAX_ALLOWED
#define __MAC_OS_X_VERSION_MAX_ALLOWED 150000
#endif

// arm64 macOS (LP64, BOOL is bool).
typedef long NSInteger;
typedef unsigned long NSUInteger;
typedef bool BOOL;
#define nil nullptr
#define YES __objc_yes
#define NO __objc_no

// C++ forms of Foundation's enum macros: NS_ENUM is a typed enum, NS_OPTIONS an
// integer typedef plus constants, so options can be OR-ed as in the real SDK.
#define NS_ENUM(_type, _name) \
  enum _name : _type _name;   \
  enum _name : _type
#define NS_OPTIONS(_type, _name) \
  _type _name;                   \
  enum : _type
#define NS_RETURNS_RETAINED __attribute__((ns_returns_retained))
#define API_AVAILABLE(...)
#define API_DEPRECATED(...)

@protocol NSObject
@end

__attribute__((objc_root_class))
@interface NSObject<NSObject>
+ (instancetype)alloc;
- (instancetype)init;
@end

typedef NSUInteger NSStringEncoding;
enum : NSStringEncoding {
  NSUTF8StringEncoding = 4,
};

@interface NSString : NSObject
- (instancetype)initWithBytes:(const void*)bytes length:(NSUInteger)len encoding:(NSStringEncoding)encoding;
@property(readonly) const char* UTF8String;
@end

@interface NSArray<__covariant ObjectType> : NSObject
@property(readonly) ObjectType firstObject;
@property(readonly) NSUInteger count;
- (ObjectType)objectAtIndex:(NSUInteger)index;
@end

@interface NSURL : NSObject
+ (NSURL*)fileURLWithPath:(NSString*)path;
@end

@interface NSDictionary<__covariant KeyType, __covariant ObjectType> : NSObject
- (ObjectType)objectForKey:(KeyType)aKey;
@end

@interface NSError : NSObject
@property(readonly, copy) NSString* localizedDescription;
// NSDictionary<NSErrorUserInfoKey, id>* in the SDK, NSErrorUserInfoKey being a typedef of NSString*.
@property(readonly, copy) NSDictionary<NSString*, id>* userInfo;
@end
