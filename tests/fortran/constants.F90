! Prints the ferroccl module's constants and struct layouts in the format of tests/c/constants.c;
! tests/packaging/test-fortran.sh diffs the two outputs (the module must match nccl.h).
program constants
  use, intrinsic :: iso_c_binding
  use ferroccl
  implicit none
  type(ncclUniqueId), target :: id
  type(ncclConfig_t), target :: c
  type(ncclSimInfo_t), target :: s
  type(ncclEncryptionConfig_t), target :: e

  call p('NCCL_MAJOR', NCCL_MAJOR); call p('NCCL_MINOR', NCCL_MINOR)
  call p('NCCL_PATCH', NCCL_PATCH); call p('NCCL_VERSION_CODE', NCCL_VERSION_CODE)
  call p('FERROCCL_VERSION_MAJOR', FERROCCL_VERSION_MAJOR)
  call p('FERROCCL_VERSION_MINOR', FERROCCL_VERSION_MINOR)
  call p('FERROCCL_VERSION_PATCH', FERROCCL_VERSION_PATCH)
  call p('ncclSuccess', ncclSuccess); call p('ncclUnhandledCudaError', ncclUnhandledCudaError)
  call p('ncclSystemError', ncclSystemError); call p('ncclInternalError', ncclInternalError)
  call p('ncclInvalidArgument', ncclInvalidArgument); call p('ncclInvalidUsage', ncclInvalidUsage)
  call p('ncclRemoteError', ncclRemoteError); call p('ncclInProgress', ncclInProgress)
  call p('ncclTimeout', ncclTimeout); call p('ncclNumResults', ncclNumResults)
  call p('ncclInt8', ncclInt8); call p('ncclChar', ncclChar); call p('ncclUint8', ncclUint8)
  call p('ncclInt32', ncclInt32); call p('ncclInt', ncclInt); call p('ncclUint32', ncclUint32)
  call p('ncclInt64', ncclInt64); call p('ncclUint64', ncclUint64)
  call p('ncclFloat16', ncclFloat16); call p('ncclHalf', ncclHalf)
  call p('ncclFloat32', ncclFloat32); call p('ncclFloat', ncclFloat)
  call p('ncclFloat64', ncclFloat64); call p('ncclDouble', ncclDouble)
  call p('ncclBfloat16', ncclBfloat16); call p('ncclFloat8e4m3', ncclFloat8e4m3)
  call p('ncclFloat8e5m2', ncclFloat8e5m2); call p('ncclNumTypes', ncclNumTypes)
  call p('ncclSum', ncclSum); call p('ncclProd', ncclProd); call p('ncclMax', ncclMax)
  call p('ncclMin', ncclMin); call p('ncclAvg', ncclAvg); call p('ncclNumOps', ncclNumOps)
  call p('ncclMaxRedOp', ncclMaxRedOp)
  call p('ncclScalarDevice', ncclScalarDevice)
  call p('ncclScalarHostImmediate', ncclScalarHostImmediate)
  call p('NCCL_UNIQUE_ID_BYTES', NCCL_UNIQUE_ID_BYTES)
  call p('NCCL_CONFIG_UNDEF_INT', NCCL_CONFIG_UNDEF_INT)
  call p('NCCL_SPLIT_NOCOLOR', NCCL_SPLIT_NOCOLOR)
  call p('NCCL_API_MAGIC', NCCL_API_MAGIC)
  call p('NCCL_WIN_DEFAULT', NCCL_WIN_DEFAULT)
  call p('NCCL_WIN_COLL_SYMMETRIC', NCCL_WIN_COLL_SYMMETRIC)
  call p('NCCL_WIN_STRICT_ORDERING', NCCL_WIN_STRICT_ORDERING)
  call p('NCCL_WIN_REQUIRED_ALIGNMENT', NCCL_WIN_REQUIRED_ALIGNMENT)
  call p('NCCL_CTA_POLICY_DEFAULT', NCCL_CTA_POLICY_DEFAULT)
  call p('NCCL_CTA_POLICY_EFFICIENCY', NCCL_CTA_POLICY_EFFICIENCY)
  call p('NCCL_CTA_POLICY_ZERO', NCCL_CTA_POLICY_ZERO)
  call p('NCCL_SHRINK_DEFAULT', NCCL_SHRINK_DEFAULT)
  call p('NCCL_SHRINK_ABORT', NCCL_SHRINK_ABORT)
  call p('NCCL_ENCRYPTION_MODE_NONE', NCCL_ENCRYPTION_MODE_NONE)
  call p('NCCL_ENCRYPTION_MODE_PSK', NCCL_ENCRYPTION_MODE_PSK)
  write(*, '(a,1x,f0.1)') 'NCCL_UNDEF_FLOAT', NCCL_UNDEF_FLOAT
  call p8('sizeof(ncclUniqueId)', c_sizeof(id))
  call p8('sizeof(ncclConfig_t)', c_sizeof(c))
  call p8('sizeof(ncclSimInfo_t)', c_sizeof(s))
  call p8('sizeof(ncclEncryptionConfig_t)', c_sizeof(e))
  call off('ncclConfig_t', 'size', c_loc(c), c_loc(c%size))
  call off('ncclConfig_t', 'magic', c_loc(c), c_loc(c%magic))
  call off('ncclConfig_t', 'version', c_loc(c), c_loc(c%version))
  call off('ncclConfig_t', 'blocking', c_loc(c), c_loc(c%blocking))
  call off('ncclConfig_t', 'cgaClusterSize', c_loc(c), c_loc(c%cgaClusterSize))
  call off('ncclConfig_t', 'minCTAs', c_loc(c), c_loc(c%minCTAs))
  call off('ncclConfig_t', 'maxCTAs', c_loc(c), c_loc(c%maxCTAs))
  call off('ncclConfig_t', 'netName', c_loc(c), c_loc(c%netName))
  call off('ncclConfig_t', 'splitShare', c_loc(c), c_loc(c%splitShare))
  call off('ncclConfig_t', 'trafficClass', c_loc(c), c_loc(c%trafficClass))
  call off('ncclConfig_t', 'commName', c_loc(c), c_loc(c%commName))
  call off('ncclConfig_t', 'collnetEnable', c_loc(c), c_loc(c%collnetEnable))
  call off('ncclConfig_t', 'CTAPolicy', c_loc(c), c_loc(c%CTAPolicy))
  call off('ncclConfig_t', 'shrinkShare', c_loc(c), c_loc(c%shrinkShare))
  call off('ncclConfig_t', 'nvlsCTAs', c_loc(c), c_loc(c%nvlsCTAs))
  call off('ncclConfig_t', 'nChannelsPerNetPeer', c_loc(c), c_loc(c%nChannelsPerNetPeer))
  call off('ncclConfig_t', 'nvlinkCentricSched', c_loc(c), c_loc(c%nvlinkCentricSched))
  call off('ncclConfig_t', 'graphUsageMode', c_loc(c), c_loc(c%graphUsageMode))
  call off('ncclConfig_t', 'numRmaCtx', c_loc(c), c_loc(c%numRmaCtx))
  call off('ncclConfig_t', 'maxP2pPeers', c_loc(c), c_loc(c%maxP2pPeers))
  call off('ncclConfig_t', 'graphStreamOrdering', c_loc(c), c_loc(c%graphStreamOrdering))
  call off('ncclSimInfo_t', 'magic', c_loc(s), c_loc(s%magic))
  call off('ncclSimInfo_t', 'version', c_loc(s), c_loc(s%version))
  call off('ncclSimInfo_t', 'estimatedTime', c_loc(s), c_loc(s%estimatedTime))
  call off('ncclEncryptionConfig_t', 'magic', c_loc(e), c_loc(e%magic))
  call off('ncclEncryptionConfig_t', 'version', c_loc(e), c_loc(e%version))
  call off('ncclEncryptionConfig_t', 'mode', c_loc(e), c_loc(e%mode))
  call off('ncclEncryptionConfig_t', 'psk', c_loc(e), c_loc(e%psk))

  c = ncclConfigInitializer()
  s = ncclSimInfoInitializer()
  e = ncclEncryptionConfigInitializer()
  write(*, '(a,5(1x,i0),1x,i0)') 'NCCL_CONFIG_INITIALIZER', c%size, c%magic, c%version, &
    c%blocking, merge(1, 0, .not. c_associated(c%netName)), &
    merge(1, 0, .not. c_associated(c%commName))
  write(*, '(a,3(1x,i0),1x,f0.1)') 'NCCL_SIM_INFO_INITIALIZER', s%size, s%magic, s%version, &
    s%estimatedTime
  write(*, '(a,4(1x,i0),1x,i0)') 'NCCL_ENCRYPTION_CONFIG_INITIALIZER', e%size, e%magic, &
    e%version, e%mode, merge(1, 0, .not. c_associated(e%psk))

contains

  subroutine p(name, value)
    character(len=*), intent(in) :: name
    integer(c_int), intent(in) :: value
    write(*, '(a,1x,i0)') name, value
  end subroutine p

  subroutine p8(name, value)
    character(len=*), intent(in) :: name
    integer(c_size_t), intent(in) :: value
    write(*, '(a,1x,i0)') name, value
  end subroutine p8

  subroutine off(type_name, field, base, field_addr)
    character(len=*), intent(in) :: type_name, field
    type(c_ptr), intent(in) :: base, field_addr
    write(*, '(a,i0)') 'offsetof(' // type_name // ',' // field // ') ', &
      transfer(field_addr, 0_c_intptr_t) - transfer(base, 0_c_intptr_t)
  end subroutine off
end program constants
